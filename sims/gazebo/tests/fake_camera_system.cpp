// A stand-in for gz-sensors' camera, for the plugin's tests in a gz-sim built without a render
// engine (no OGRE here, so no camera sensor can render). It keeps the camera's timing: in its
// PostUpdate (a thread of its own, beside the plugin's) it takes the world's state at each of its
// update times, a thread of its own "renders" it a moment later and publishes a gz::msgs::Image
// stamped with that sim time; it waits for the previous frame before taking the next, as gz-sim's
// Sensors system waits for its render thread.
//
// The picture: an L8 (or R8G8B8) image whose first 4 bytes are the observed joint's position as
// float32 and whose other bytes count up, in rows padded to a step of width x channels + 3 bytes. A
// test compares the 4 bytes with the joint position in the same observation: a stale frame shows
// another angle.
//
//   <plugin filename="simbridge-gz-test-camera" name="simbridge::gazebo::FakeCamera">
//     <topic>/pendulum/camera</topic> <joint>hinge</joint> <width>24</width> <height>20</height>
//     <update_rate>50</update_rate>   <!-- Hz of sim time; 0: every iteration -->
//     <format>L8</format>             <!-- or R8G8B8 -->
//     <render_ms>1</render_ms>        <!-- how long a "render" takes, wall ms -->
//   </plugin>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <gz/common/Console.hh>
#include <gz/msgs/image.pb.h>
#include <gz/plugin/Register.hh>
#include <gz/sim/Joint.hh>
#include <gz/sim/Model.hh>
#include <gz/sim/System.hh>
#include <gz/transport/Node.hh>
#include <sdf/Element.hh>

namespace simbridge {
namespace gazebo {

class FakeCamera : public gz::sim::System,
                   public gz::sim::ISystemConfigure,
                   public gz::sim::ISystemPostUpdate,
                   public gz::sim::ISystemReset {
 public:
  void Configure(const gz::sim::Entity& entity, const std::shared_ptr<const sdf::Element>& sdf,
                 gz::sim::EntityComponentManager& ecm, gz::sim::EventManager&) override {
    width_ = sdf->Get<int>("width", 24).first;
    height_ = sdf->Get<int>("height", 20).first;
    rgb_ = sdf->Get<std::string>("format", "L8").first == "R8G8B8";
    render_ = std::chrono::microseconds(static_cast<int64_t>(1000 * sdf->Get<double>("render_ms", 1.0).first));
    const double rate = sdf->Get<double>("update_rate", 0.0).first;
    period_ = rate > 0 ? std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                             std::chrono::duration<double>(1.0 / rate))
                       : std::chrono::steady_clock::duration::zero();
    joint_ = gz::sim::Joint(gz::sim::Model(entity).JointByName(ecm, sdf->Get<std::string>("joint", "hinge").first));
    joint_.EnablePositionCheck(ecm, true);
    publisher_ = node_.Advertise<gz::msgs::Image>(sdf->Get<std::string>("topic", "/camera").first);
    // The picture but its first 4 bytes is the same every frame: drawn once, so the world's CPU in
    // bench/gazebo_farm.py's camera rows is the frames' way to the trainer, not this stand-in's drawing.
    const int row = width_ * (rgb_ ? 3 : 1), step = row + 3;
    picture_.assign(static_cast<size_t>(step * height_), '\xff');   // padding: never part of a frame
    for (int y = 0; y < height_; ++y)
      for (int x = 0; x < row; ++x) picture_[y * step + x] = static_cast<char>((y * row + x) % 251);
    renderer_ = std::thread([this] { render_loop(); });
  }

  void PostUpdate(const gz::sim::UpdateInfo& info, const gz::sim::EntityComponentManager& ecm) override {
    if (info.paused || info.simTime < next_) return;
    const auto position = joint_.Position(ecm);
    if (!position || position->empty()) return;
    std::unique_lock<std::mutex> lock(mutex_);
    idle_.wait(lock, [this] { return !pending_ || stopping_; });   // the previous frame is out first
    stamp_ = info.simTime;
    angle_ = static_cast<float>(position->front());
    pending_ = true;
    next_ = info.simTime + period_;
    wake_.notify_all();
  }

  void Reset(const gz::sim::UpdateInfo&, gz::sim::EntityComponentManager& ecm) override {
    joint_.EnablePositionCheck(ecm, true);
    next_ = std::chrono::steady_clock::duration::zero();
  }

  ~FakeCamera() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    idle_.notify_all();
    if (renderer_.joinable()) renderer_.join();
  }

 private:
  void render_loop() {
    const int step = width_ * (rgb_ ? 3 : 1) + 3;
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      wake_.wait(lock, [this] { return pending_ || stopping_; });
      if (stopping_) return;
      gz::msgs::Image image;
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(stamp_).count();
      image.mutable_header()->mutable_stamp()->set_sec(ns / 1'000'000'000);
      image.mutable_header()->mutable_stamp()->set_nsec(ns % 1'000'000'000);
      image.set_width(width_);
      image.set_height(height_);
      image.set_step(step);
      image.set_pixel_format_type(rgb_ ? gz::msgs::PixelFormatType::RGB_INT8 : gz::msgs::PixelFormatType::L_INT8);
      std::string* data = image.mutable_data();
      *data = picture_;
      std::memcpy(&(*data)[0], &angle_, sizeof angle_);
      lock.unlock();
      std::this_thread::sleep_for(render_);   // rendering takes a while
      publisher_.Publish(image);
      lock.lock();
      pending_ = false;
      idle_.notify_all();
    }
  }

  int width_ = 24, height_ = 20;
  bool rgb_ = false;
  std::chrono::microseconds render_{1000};
  std::string picture_;
  std::chrono::steady_clock::duration period_{}, next_{}, stamp_{};
  gz::sim::Joint joint_{gz::sim::kNullEntity};
  gz::transport::Node node_;
  gz::transport::Node::Publisher publisher_;
  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  bool pending_ = false, stopping_ = false;
  float angle_ = 0;
  std::thread renderer_;
};

}  // namespace gazebo
}  // namespace simbridge

GZ_ADD_PLUGIN(simbridge::gazebo::FakeCamera, gz::sim::System, simbridge::gazebo::FakeCamera::ISystemConfigure,
              simbridge::gazebo::FakeCamera::ISystemPostUpdate, simbridge::gazebo::FakeCamera::ISystemReset)
