// simbridge::gazebo::SimbridgeSystem: a gz-sim 8 (Harmonic) system that lets a trainer drive one
// model through simbridge. Glue only: gz-sim reads and writes here, every decision is in
// episode_logic.cpp (built and tested without Gazebo), the trainer is reached through the C++ SDK.
//
// Compiled where gz-sim 8 is installed (docker/gazebo.Dockerfile; tests/sims/test_gazebo_sim.py against a
// prefix, warnings as errors); see docs/gazebo.md.
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gz/common/Console.hh>
#include <gz/msgs/boolean.pb.h>
#include <gz/msgs/image.pb.h>
#include <gz/msgs/world_control.pb.h>
#include <gz/plugin/Register.hh>
#include <gz/sim/Joint.hh>
#include <gz/sim/Model.hh>
#include <gz/sim/System.hh>
#include <gz/sim/Util.hh>
#include <gz/sim/World.hh>
#include <gz/transport/Node.hh>
#include <sdf/Element.hh>
#include <simbridge/client.hpp>

#include "episode_logic.hpp"

namespace simbridge {
namespace gazebo {
namespace {

simbridge::Space to_space(const simbridge_gz::SpaceSpec& spec) {
  if (spec.discrete) return simbridge::Space::Discrete(spec.n);
  if (spec.image.empty()) return simbridge::Space::Box(spec.low, spec.high);
  // The driver's row is the image's values, then the joints': the Dict's declared order.
  simbridge::Space image = simbridge::Space::Image(spec.image);
  if (!spec.joints) return image;
  return simbridge::Space::Dict({"camera", "joints"}, {image, simbridge::Space::Box(spec.low, spec.high)});
}

int64_t nanoseconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

// The driver's Agent, served by the SDK's PolicyClient.
class PolicyClientAgent final : public simbridge_gz::Agent {
 public:
  explicit PolicyClientAgent(simbridge::PolicyClient& client) : client_(client) {}
  std::string start_episode(bool training_enabled) override { return client_.start_episode(training_enabled); }
  simbridge_gz::Floats get_action(const std::string& id, const simbridge_gz::Floats& obs) override {
    return client_.get_action(id, obs);
  }
  void log_returns(const std::string& id, double reward) override { client_.log_returns(id, reward); }
  void end_episode(const std::string& id, const simbridge_gz::Floats& obs, bool truncated) override {
    client_.end_episode(id, obs, truncated);
  }

 private:
  simbridge::PolicyClient& client_;
};

// The SDK's diagnostics (reconnects, moves to another host) into gz-sim's own log.
void to_gz_log(simbridge::LogLevel level, const std::string& message) {
  switch (level) {
    case simbridge::LogLevel::Error: gzerr << "simbridge: " << message << std::endl; break;
    case simbridge::LogLevel::Warning: gzwarn << "simbridge: " << message << std::endl; break;
    default: gzmsg << "simbridge: " << message << std::endl; break;
  }
}

void on_reset_reply(const gz::msgs::Boolean& reply, const bool result) {
  if (!result || !reply.data()) gzerr << "simbridge: the world refused the reset request" << std::endl;
}

}  // namespace

class SimbridgeSystem : public gz::sim::System,
                        public gz::sim::ISystemConfigure,
                        public gz::sim::ISystemPreUpdate,
                        public gz::sim::ISystemPostUpdate,
                        public gz::sim::ISystemReset {
 public:
  void Configure(const gz::sim::Entity& entity, const std::shared_ptr<const sdf::Element>& sdf,
                 gz::sim::EntityComponentManager& ecm, gz::sim::EventManager&) override {
    try {
      const simbridge_gz::Config config = simbridge_gz::parse_config(plugin_params(sdf), std::getenv("SIMBRIDGE_ADDRESS"));
      const gz::sim::Model model(entity);
      if (!model.Valid(ecm)) throw std::invalid_argument("attach the plugin to a <model>");
      observed_ = joints_by_name(model, ecm, config.observe_joints);
      actuated_ = joints_by_name(model, ecm, config.actuate_joints);
      enable_state_checks(ecm);
      const auto world_name = gz::sim::World(gz::sim::worldEntity(ecm)).Name(ecm);
      control_service_ = "/world/" + world_name.value_or("default") + "/control";
      if (config.observe_camera) {
        frames_ = std::make_shared<simbridge_gz::FrameBuffer>(config.camera);
        // The callback owns the buffer with the plugin: gz-transport delivers queued images on its own
        // thread and does not wait for them when the node goes, so one may arrive after this object.
        std::function<void(const gz::msgs::Image&)> on_image = [frames = frames_](const gz::msgs::Image& image) {
          const auto& stamp = image.header().stamp();
          frames->offer(image.width(), image.height(), image.step(), image.pixel_format_type(), image.data(),
                        stamp.sec() * 1'000'000'000LL + stamp.nsec());
        };
        if (!node_.Subscribe(config.camera.topic, on_image))
          throw std::invalid_argument("could not subscribe to <camera_topic> " + config.camera.topic);
      }

      simbridge::ClientOptions options;
      options.client_name = config.client_name;
      options.connect_timeout_s = config.connect_timeout_s;
      options.log = to_gz_log;
      options.tls_ca_file = config.tls_ca;
      options.tls_cert_file = config.tls_cert;
      options.tls_key_file = config.tls_key;
      options.tls_server_name = config.tls_server_name;
      options.auth_token_file = config.auth_token_file;
      gzmsg << "simbridge: connecting to " << config.address << " for model [" << model.Name(ecm) << "]"
            << std::endl;
      client_ = std::make_unique<simbridge::PolicyClient>(config.address, to_space(simbridge_gz::observation_space(config)),
                                                          to_space(simbridge_gz::action_space(config)), options);
      agent_ = std::make_unique<PolicyClientAgent>(*client_);
      config_ = config;
      driver_ = std::make_unique<simbridge_gz::EpisodeDriver>(config_, *agent_, frames_.get());
    } catch (const std::exception& e) {
      stop(std::string("not started: ") + e.what());
    }
  }

  void PreUpdate(const gz::sim::UpdateInfo& info, gz::sim::EntityComponentManager& ecm) override {
    if (!driver_ || info.paused) return;
    const simbridge_gz::Command command = driver_->before_step();
    for (size_t i = 0; i < actuated_.size(); ++i) actuated_[i].SetForce(ecm, {command.efforts[i]});
    if (command.reset_positions) {
      for (size_t i = 0; i < observed_.size(); ++i) {
        observed_[i].ResetPosition(ecm, {(*command.reset_positions)[i]});
        observed_[i].ResetVelocity(ecm, {(*command.reset_velocities)[i]});
      }
    }
    if (command.request_world_reset) {
      gz::msgs::WorldControl request;
      request.mutable_reset()->set_all(true);   // pause stays false: the world runs on after the reset
      if (!node_.Request(control_service_, request, on_reset_reply))
        gzerr << "simbridge: could not request a reset on " << control_service_ << std::endl;
    }
  }

  void PostUpdate(const gz::sim::UpdateInfo& info, const gz::sim::EntityComponentManager& ecm) override {
    if (!driver_ || info.paused) return;
    std::vector<simbridge_gz::JointReading> readings;
    for (const auto& joint : observed_) {
      const auto position = joint.Position(ecm);
      const auto velocity = joint.Velocity(ecm);
      if (!position || !velocity || position->empty() || velocity->empty()) return;   // physics has not filled them yet
      readings.push_back({position->front(), velocity->front()});
    }
    try {
      // may block on the trainer (the world waits for its action) and on the camera's frame
      driver_->after_step(readings, nanoseconds(info.simTime), nanoseconds(info.dt));
      count_ended_episodes("its limits");
    } catch (const simbridge::SessionLost& e) {
      new_session(e.what());
    } catch (const simbridge::Error& e) {
      stop(e.what(), e.reason() == "TRAINING_OVER");
    } catch (const std::exception& e) {
      stop(e.what());
    }
  }

  void Reset(const gz::sim::UpdateInfo&, gz::sim::EntityComponentManager& ecm) override {
    if (!driver_) return;
    enable_state_checks(ecm);   // the reset restored the ECM as it was before Configure asked for them
    if (frames_) frames_->clear();
    try {
      driver_->on_world_reset();
      count_ended_episodes("a world reset from outside");
    } catch (const simbridge::SessionLost& e) {
      new_session(e.what());
    } catch (const simbridge::Error& e) {
      stop(e.what(), e.reason() == "TRAINING_OVER");
    } catch (const std::exception& e) {
      stop(e.what());
    }
  }

  ~SimbridgeSystem() override {
    if (!driver_) return;
    const bool open = !driver_->episode_id().empty();
    gzmsg << "simbridge: " << episodes_ << " episodes ended (" << actions_ << " actions), " << (open ? 1 : 0)
          << " open (" << (open ? driver_->episode_steps() : 0) << " actions), " << sessions_lost_ << " sessions lost"
          << std::endl;
  }

 private:
  static std::map<std::string, std::string> plugin_params(const std::shared_ptr<const sdf::Element>& sdf) {
    std::map<std::string, std::string> params;
    for (auto child = sdf->GetFirstElement(); child; child = child->GetNextElement()) {
      const std::string& name = child->GetName();
      if (name.find(':') != std::string::npos) continue;   // gz:system_priority and friends are gz-sim's own
      params[name] = sdf->Get<std::string>(name);
    }
    return params;
  }

  static std::vector<gz::sim::Joint> joints_by_name(const gz::sim::Model& model, const gz::sim::EntityComponentManager& ecm,
                                                    const std::vector<std::string>& names) {
    std::vector<gz::sim::Joint> joints;
    for (const auto& name : names) {
      const gz::sim::Entity entity = model.JointByName(ecm, name);
      if (entity == gz::sim::kNullEntity) throw std::invalid_argument("the model has no joint named '" + name + "'");
      joints.emplace_back(entity);
    }
    return joints;
  }

  void enable_state_checks(gz::sim::EntityComponentManager& ecm) {
    for (auto& joint : observed_) {
      joint.EnablePositionCheck(ecm, true);
      joint.EnableVelocityCheck(ecm, true);
    }
  }

  // The plugin's own count, logged at gzmsg level (gz sim -v 3): what the trainer's metrics must match.
  void count_ended_episodes(const char* by) {
    if (driver_->episodes_ended() == counted_) return;
    counted_ = driver_->episodes_ended();
    ++episodes_;
    actions_ += driver_->episode_steps();
    gzmsg << "simbridge: episode " << episodes_ << " ended after " << driver_->episode_steps() << " actions, by " << by
          << std::endl;
  }

  // The trainer restarted (or moved hosts): the SDK reconnected with a new session and the open episode
  // is gone. A fresh driver starts the next episode from a new start state; the world goes on.
  void new_session(const std::string& why) {
    gzwarn << "simbridge: " << why << "; going on with new episodes" << std::endl;
    driver_ = std::make_unique<simbridge_gz::EpisodeDriver>(config_, *agent_, frames_.get());
    counted_ = 0;
    ++sessions_lost_;
  }

  // A failure stops this plugin, not the simulation: the world runs on without efforts. So does the
  // trainer's end (TRAINING_OVER: its run reached total_env_steps), which is no failure.
  void stop(const std::string& why, bool training_over = false) {
    if (training_over)
      gzmsg << "simbridge: " << why << "; the plugin is inactive from now on" << std::endl;
    else
      gzerr << "simbridge: " << why << "; the plugin is inactive from now on" << std::endl;
    driver_.reset();
    agent_.reset();
    if (client_) {
      try {
        client_->close();
      } catch (const std::exception&) {
      }
      client_.reset();
    }
  }

  std::vector<gz::sim::Joint> observed_, actuated_;
  simbridge_gz::Config config_;
  int64_t counted_ = 0;    // the current driver's episodes_ended() already counted
  int64_t episodes_ = 0, actions_ = 0, sessions_lost_ = 0;
  std::string control_service_;
  std::shared_ptr<simbridge_gz::FrameBuffer> frames_;   // shared with the camera's callback
  gz::transport::Node node_;
  std::unique_ptr<simbridge::PolicyClient> client_;
  std::unique_ptr<PolicyClientAgent> agent_;
  std::unique_ptr<simbridge_gz::EpisodeDriver> driver_;
};

}  // namespace gazebo
}  // namespace simbridge

GZ_ADD_PLUGIN(simbridge::gazebo::SimbridgeSystem, gz::sim::System,
              simbridge::gazebo::SimbridgeSystem::ISystemConfigure, simbridge::gazebo::SimbridgeSystem::ISystemPreUpdate,
              simbridge::gazebo::SimbridgeSystem::ISystemPostUpdate, simbridge::gazebo::SimbridgeSystem::ISystemReset)
