// A camera's frames as the plugin's observation: which images a camera may send, and the newest
// frame taken late enough to stand for the state the trainer is asked about.
//
// gz-sensors' camera renders on gz-sim's render thread, after the Sensors system's PostUpdate for
// that time, and publishes a gz::msgs::Image stamped with the sim time it shows. So the frame of
// time t arrives while the world's iteration t is still in its PostUpdate (gz-sim runs systems'
// PostUpdate on threads of their own): the plugin, in its own PostUpdate, waits for it. No gz here:
// the glue hands over the message's fields, so every rule is tested without Gazebo.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace simbridge_gz {

// The 8-bit formats a camera sensor's SDF <image><format> can name, with gz-msgs' PixelFormatType
// number for it. Depth and 16-bit images are not images the trainer's encoders take.
struct ImageFormat {
  const char* sdf_name;    // what the camera's <format> says: R8G8B8, B8G8R8, L8
  int msgs_type;           // gz::msgs::PixelFormatType: RGB_INT8 = 3, BGR_INT8 = 8, L_INT8 = 1
  const char* msgs_name;
  int channels;
};
// nullptr for a name not in the table.
const ImageFormat* image_format(const std::string& sdf_name);
std::string image_format_names();   // "R8G8B8, B8G8R8, L8": for error messages

struct CameraConfig {
  std::string topic;        // the camera sensor's <topic>; empty: no camera
  int64_t width = 0, height = 0;
  std::string format = "R8G8B8";
  double timeout_s = 5;     // wall seconds the world waits for a frame before the plugin gives up
  // How much older than the action step its frame may be, in sim seconds. < 0 (the default): taken
  // after the previous action's observation, which a camera at the action's rate always has; 0: the
  // frame of this very iteration (a camera that renders every physics step).
  double max_age_s = -1;
  int channels() const;
};

// One frame, rows packed (height x width x channels, HWC, no row padding).
struct Frame {
  std::vector<uint8_t> pixels;
  int64_t stamp_ns = 0;     // the sim time the frame shows
};

struct CameraError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Where the driver gets a frame from; FrameBuffer in the plugin, a stand-in in the tests.
class Camera {
 public:
  virtual ~Camera() = default;
  // The newest frame if it is stamped within [not_before_ns, not_after_ns], waiting up to wait_s
  // wall seconds for one (0: not at all); nullopt if none came. Throws CameraError for images unlike
  // the config. not_after_ns is the sim time now: a frame stamped later shows a timeline a world
  // reset ended (a render still in flight at the reset).
  virtual std::optional<Frame> frame(int64_t not_before_ns, int64_t not_after_ns, double wait_s) = 0;
  // Why no frame came, and what to change: the driver's error when it gives up waiting.
  virtual std::string missing(int64_t not_before_ns, double seconds_per_action) = 0;
};

// The newest frame a camera sent. offer() runs on gz-transport's thread, frame() on gz-sim's.
class FrameBuffer final : public Camera {
 public:
  explicit FrameBuffer(CameraConfig config);

  // One gz::msgs::Image's fields. An image that does not match the config is kept as the error the
  // next frame() call throws: a camera configured unlike the plugin is a mistake to name, not to skip.
  void offer(int64_t width, int64_t height, int64_t step, int pixel_format_type, const std::string& data,
             int64_t stamp_ns);
  std::optional<Frame> frame(int64_t not_before_ns, int64_t not_after_ns, double wait_s) override;
  std::string missing(int64_t not_before_ns, double seconds_per_action) override;
  // A world reset takes sim time back to 0: frames of the old times would pass for new ones.
  void clear();

 private:
  const CameraConfig config_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  Frame newest_;
  bool have_ = false;
  int64_t offered_ = 0;
  std::string error_;
};

}  // namespace simbridge_gz
