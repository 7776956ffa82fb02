#include "camera.hpp"

#include <cstring>
#include <sstream>
#include <utility>

namespace simbridge_gz {
namespace {

const ImageFormat kFormats[] = {
    {"R8G8B8", 3, "RGB_INT8", 3},
    {"B8G8R8", 8, "BGR_INT8", 3},
    {"L8", 1, "L_INT8", 1},
};

std::string seconds(double s) {
  std::ostringstream out;
  out << s;
  return out.str();
}

}  // namespace

const ImageFormat* image_format(const std::string& sdf_name) {
  for (const auto& f : kFormats)
    if (sdf_name == f.sdf_name) return &f;
  return nullptr;
}

std::string image_format_names() {
  std::string names;
  for (const auto& f : kFormats) names += std::string(names.empty() ? "" : ", ") + f.sdf_name;
  return names;
}

int CameraConfig::channels() const {
  const ImageFormat* f = image_format(format);
  return f ? f->channels : 0;
}

FrameBuffer::FrameBuffer(CameraConfig config) : config_(std::move(config)) {}

void FrameBuffer::offer(int64_t width, int64_t height, int64_t step, int pixel_format_type, const std::string& data,
                        int64_t stamp_ns) {
  const ImageFormat* want = image_format(config_.format);
  const int64_t row = config_.width * config_.channels();
  std::string wrong;
  if (width != config_.width || height != config_.height || !want || pixel_format_type != want->msgs_type) {
    std::string got = "pixel format " + std::to_string(pixel_format_type);
    for (const auto& f : kFormats)
      if (f.msgs_type == pixel_format_type) got = f.sdf_name;
    wrong = "the camera on " + config_.topic + " sends " + std::to_string(width) + "x" + std::to_string(height) +
            " " + got + " images, the plugin expects " + std::to_string(config_.width) + "x" +
            std::to_string(config_.height) + " " + config_.format +
            ": make <camera_width>, <camera_height> and <camera_format> those of the sensor's <image>";
  } else if (step < row || static_cast<int64_t>(data.size()) < step * (height - 1) + row) {
    wrong = "the camera on " + config_.topic + " sent " + std::to_string(data.size()) + " bytes (row step " +
            std::to_string(step) + ") for a " + std::to_string(width) + "x" + std::to_string(height) + " " +
            config_.format + " image";
  }
  std::lock_guard<std::mutex> lock(mutex_);
  ++offered_;
  if (!wrong.empty()) {
    if (error_.empty()) error_ = wrong;
  } else {
    // Rows packed: a sensor may pad each row to `step` bytes.
    newest_.pixels.resize(static_cast<size_t>(row * height));
    for (int64_t y = 0; y < height; ++y)
      std::memcpy(newest_.pixels.data() + y * row, data.data() + y * step, static_cast<size_t>(row));
    newest_.stamp_ns = stamp_ns;
    have_ = true;
  }
  arrived_.notify_all();
}

std::optional<Frame> FrameBuffer::frame(int64_t not_before_ns, int64_t not_after_ns, double wait_s) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto ready = [&] {
    return !error_.empty() || (have_ && newest_.stamp_ns >= not_before_ns && newest_.stamp_ns <= not_after_ns);
  };
  if (!arrived_.wait_for(lock, std::chrono::duration<double>(wait_s), ready)) return std::nullopt;
  if (!error_.empty()) throw CameraError(error_);
  return newest_;
}

std::string FrameBuffer::missing(int64_t not_before_ns, double seconds_per_action) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (offered_ == 0)
    return "no image on " + config_.topic + " within " + seconds(config_.timeout_s) +
           " s: is <camera_topic> the camera sensor's <topic>, and does the world load gz-sim's Sensors "
           "system with a render engine?";
  return "no image from " + config_.topic + " taken at sim time " + seconds(not_before_ns * 1e-9) +
         " s or later within " + seconds(config_.timeout_s) + " s" +
         (have_ ? " (the newest shows " + seconds(newest_.stamp_ns * 1e-9) + " s)" : std::string()) +
         ": the camera's <update_rate> must give a frame for every action, at least " +
         seconds(1.0 / seconds_per_action) + " Hz here (or allow older frames: <camera_max_age>)";
}

void FrameBuffer::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  have_ = false;
  newest_.stamp_ns = 0;
}

}  // namespace simbridge_gz
