// Everything the simbridge Gazebo system decides, without Gazebo and without the SDK.
//
// The gz-sim plugin (simbridge_system.cpp) is glue: it reads joint states out of the
// EntityComponentManager, hands them to an EpisodeDriver, and writes back what the driver
// commands (efforts, joint resets, a world reset request). The driver talks to the trainer
// through the small Agent interface below, which the plugin implements with
// simbridge::PolicyClient. So every rule (which joints form the observation, how actions
// become efforts, when an episode ends and how, when to reset) is built and tested on a
// machine without gz-sim, and the untested plugin holds no decisions.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "camera.hpp"

namespace simbridge_gz {

using Floats = std::vector<float>;

// How the world goes back to a start state after an episode.
enum class ResetMode {
  kWorld,   // ask gz-sim for a full world reset (WorldControl reset.all), wait for ISystemReset
  kJoints,  // set the observed joints back to their start positions at once; the world runs on
};

struct Config {
  std::string address = "127.0.0.1:50051";
  std::string client_name = "gazebo";
  // How long the plugin waits for a trainer when gz-sim loads it (the world waits with it); after
  // that it logs the error and the world runs on without it. A world started before its trainer
  // needs it longer than the SDK's 30 s.
  double connect_timeout_s = 30;
  // TLS and the token, handed to the C++ SDK's ClientOptions as they are (tls_ca_file, tls_cert_file,
  // tls_key_file, tls_server_name, auth_token_file; $SIMBRIDGE_AUTH_TOKEN is read by the SDK).
  std::string tls_ca, tls_cert, tls_key, tls_server_name, auth_token_file;
  // The observation is (position, velocity) of each of these joints, in this order.
  std::vector<std::string> observe_joints;
  // The action drives these joints with efforts (N for prismatic joints, N·m for revolute ones).
  std::vector<std::string> actuate_joints;
  std::vector<double> effort_limits;           // one per actuated joint, > 0
  // |position| beyond this ends the episode (terminated); one per observed joint, inf: no limit.
  std::vector<double> position_limits;
  int64_t discrete_actions = 0;                // 0: Box(-1, 1) per actuated joint; N >= 2: Discrete(N)
  int64_t max_episode_steps = 500;             // actions per episode, then truncated; 0: no bound
  int64_t steps_per_action = 1;                // physics iterations one action is held for
  double reward_per_step = 1.0;                // reward for every action the episode survives
  double init_noise = 0.05;                    // start positions and velocities: uniform(-x, x)
  ResetMode reset = ResetMode::kWorld;
  int64_t reset_timeout_steps = 1000;          // ask for a world reset again after this many iterations
  uint32_t seed = 0;
  bool training = true;                        // start_episode(training_enabled)
  // A camera sensor's images (camera.hpp), and what the observation holds: the joints' states, the
  // camera's frame, or both (a Dict {camera, joints}). The joints are read either way: the episode's
  // limits and resets are theirs.
  CameraConfig camera;
  bool observe_joint_states = true;
  bool observe_camera = false;
};

// The plugin's parameters by name (the SDF <plugin> element's children, as text).
// Throws std::invalid_argument naming the parameter for anything missing, malformed or inconsistent.
// address_from_env (the plugin passes $SIMBRIDGE_ADDRESS) wins over <address> when set and not
// empty: one world file serves a laptop and a container whose trainer is elsewhere.
Config parse_config(const std::map<std::string, std::string>& params, const char* address_from_env = nullptr);
// The parameter names parse_config reads; the plugin looks up exactly these.
const std::vector<std::string>& config_keys();

// What the session declares: a Box of floats, or Discrete(n); for an observation with a camera, a
// uint8 image of shape `image` (height, width, channels), alone or beside the joints' Box as the
// Dict {camera, joints}, whose row is the image's values then the joints'.
struct SpaceSpec {
  bool discrete = false;
  int64_t n = 0;
  Floats low, high;
  std::vector<int64_t> image;   // empty: no camera
  bool joints = true;           // low/high hold the joints' Box
};
SpaceSpec observation_space(const Config& config);
SpaceSpec action_space(const Config& config);

// The trainer, as the driver needs it: simbridge::PolicyClient's calls, nothing else.
class Agent {
 public:
  virtual ~Agent() = default;
  virtual std::string start_episode(bool training_enabled) = 0;
  virtual Floats get_action(const std::string& episode_id, const Floats& observation) = 0;
  virtual void log_returns(const std::string& episode_id, double reward) = 0;
  virtual void end_episode(const std::string& episode_id, const Floats& final_observation, bool truncated) = 0;
};

struct JointReading {
  double position = 0;
  double velocity = 0;
};

// What the plugin writes in PreUpdate, before physics runs the next iteration.
struct Command {
  std::vector<double> efforts;                        // one per actuated joint, always set
  std::optional<std::vector<double>> reset_positions;  // one per observed joint
  std::optional<std::vector<double>> reset_velocities;
  bool request_world_reset = false;
};

// One simulated cart-pole, pendulum, ... as an ExternalEnv episode loop, one physics iteration at a time.
//
//   PreUpdate:    command = driver.before_step()       -> apply efforts / joint resets / ask for a reset
//   PostUpdate:   driver.after_step(readings, time)    -> observe; every steps_per_action: reward,
//                                                         end checks, the next action
//   ISystemReset: driver.on_world_reset()
class EpisodeDriver {
 public:
  enum class Phase { kStarting, kActing, kAwaitingReset };

  // camera: where frames come from when the observation holds one (it must outlive the driver).
  EpisodeDriver(Config config, Agent& agent, Camera* camera = nullptr);

  Command before_step();
  // readings: one per observed joint, in Config::observe_joints order. sim_ns and step_ns: the sim
  // time after this iteration and one iteration's span, which pick the camera frame that is current.
  void after_step(const std::vector<JointReading>& readings, int64_t sim_ns = 0, int64_t step_ns = 0);
  void on_world_reset();

  Phase phase() const { return phase_; }
  const std::string& episode_id() const { return episode_id_; }
  int64_t episode_steps() const { return episode_steps_; }  // actions taken in this episode
  int64_t episodes_ended() const { return episodes_ended_; }
  // The efforts an action stands for (clamped, NaN as 0); throws std::out_of_range for a bad index.
  std::vector<double> efforts_for(const Floats& action) const;

 private:
  // The observation row; nullopt while the camera has no frame of the start state yet.
  std::optional<Floats> observe(const std::vector<JointReading>& readings, int64_t not_before_ns, int64_t now_ns,
                                bool wait);
  double seconds_per_action(int64_t step_ns) const;
  bool beyond_limits(const std::vector<JointReading>& readings) const;
  void end(const Floats& final_observation, bool truncated);
  void draw_start_state();

  Config config_;
  Agent& agent_;
  Camera* camera_;
  std::mt19937 rng_;
  Phase phase_ = Phase::kStarting;
  std::string episode_id_;
  Floats last_observation_;
  std::vector<double> efforts_;
  int64_t iterations_since_action_ = 0;
  int64_t episode_steps_ = 0;
  int64_t episodes_ended_ = 0;
  int64_t iterations_waiting_ = 0;
  bool reset_requested_ = false;
  // The start state drawn for the next episode, written until the first observation arrives (with a
  // camera: until a frame shows it, so the world holds the start state meanwhile).
  std::optional<std::vector<double>> start_positions_, start_velocities_;
  int64_t observed_ns_ = 0;            // sim time of the last observation
  int64_t starting_since_ns_ = -1;     // sim time the start state was first written; -1: not yet
  std::optional<std::chrono::steady_clock::time_point> starting_wall_;
};

}  // namespace simbridge_gz
