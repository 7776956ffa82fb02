#include "episode_logic.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <utility>

#include "params.hpp"

namespace simbridge_gz {
namespace {

using params::bad;
using params::split;
using params::to_bool;
using params::to_double;
using params::to_doubles;
using params::to_int;
using params::to_seconds;
using params::trimmed;

// As gymnasium (1.x) bounds CartPole's velocities: infinite. A world declaring CartPole-v1's spaces
// trains one policy with `simbridge-sim --env CartPole-v1` and the C++ example; FLT_MAX (gym 0.x's
// bound) was refused beside them as another space.
const float kUnbounded = std::numeric_limits<float>::infinity();

// The camera's keys and <observation>; Get: the key's text, if the <plugin> element has it.
template <typename Get>
void parse_camera(const Get& get, Config& c) {
  CameraConfig& cam = c.camera;
  if (auto v = get("camera_topic")) {
    if (split(*v).size() != 1) bad("camera_topic", "expected the camera sensor's <topic>, one word");
    cam.topic = trimmed(*v);
  }
  if (cam.topic.empty()) {
    for (const char* key : {"camera_width", "camera_height", "camera_format", "camera_timeout_s", "camera_max_age"})
      if (get(key)) bad(key, "needs <camera_topic>, the camera sensor's <topic>");
  } else {
    for (const char* key : {"camera_width", "camera_height"})
      if (!get(key)) bad(key, "a camera needs its image's size: the sensor's <image><width> and <height>");
    cam.width = to_int("camera_width", *get("camera_width"), 1);
    cam.height = to_int("camera_height", *get("camera_height"), 1);
    if (auto v = get("camera_format")) cam.format = trimmed(*v);
    if (!image_format(cam.format))
      bad("camera_format", "'" + cam.format + "': expected one of " + image_format_names() +
                               " (the sensor's <image><format>; 8-bit images only)");
    if (auto v = get("camera_timeout_s")) cam.timeout_s = to_seconds("camera_timeout_s", *v, false);
    if (auto v = get("camera_max_age")) cam.max_age_s = to_seconds("camera_max_age", *v, true);
  }
  c.observe_camera = !cam.topic.empty();
  if (auto v = get("observation")) {
    const auto words = split(*v);
    if (words.empty()) bad("observation", "name 'joints', 'camera' or both");
    c.observe_joint_states = c.observe_camera = false;
    for (const auto& word : words) {
      if (word == "joints") c.observe_joint_states = true;
      else if (word == "camera") c.observe_camera = true;
      else bad("observation", "'" + word + "': expected 'joints', 'camera' or both");
    }
    if (c.observe_camera && cam.topic.empty()) bad("observation", "'camera' needs <camera_topic>");
  }
}

}  // namespace

const std::vector<std::string>& config_keys() {
  static const std::vector<std::string> keys = {
      "address", "client_name", "observe_joints", "actuate_joints", "effort_limits", "position_limits",
      "action", "max_episode_steps", "steps_per_action", "reward_per_step", "init_noise", "reset",
      "reset_timeout_steps", "seed", "training", "tls_ca", "tls_cert", "tls_key", "tls_server_name",
      "auth_token_file", "connect_timeout_s", "observation", "camera_topic", "camera_width", "camera_height",
      "camera_format", "camera_timeout_s", "camera_max_age"};
  return keys;
}

Config parse_config(const std::map<std::string, std::string>& params, const char* address_from_env) {
  for (const auto& [key, value] : params) {
    const auto& keys = config_keys();
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) bad(key, "unknown parameter");
  }
  auto get = [&](const std::string& key) -> std::optional<std::string> {
    auto it = params.find(key);
    if (it == params.end()) return std::nullopt;
    return it->second;
  };
  Config c;
  if (auto v = get("address")) c.address = trimmed(*v);
  if (address_from_env && *address_from_env) c.address = trimmed(address_from_env);
  if (auto v = get("client_name")) c.client_name = trimmed(*v);
  if (c.address.empty() || split(c.address).size() != 1) bad("address", "expected host:port");
  if (auto v = get("connect_timeout_s")) c.connect_timeout_s = to_double("connect_timeout_s", trimmed(*v));
  if (!(c.connect_timeout_s > 0) || std::isinf(c.connect_timeout_s)) bad("connect_timeout_s", "must be finite and > 0");
  // Paths and a name: read by the SDK when the plugin connects (it names a missing file then).
  const std::pair<const char*, std::string*> passed_to_sdk[] = {
      {"tls_ca", &c.tls_ca}, {"tls_cert", &c.tls_cert}, {"tls_key", &c.tls_key},
      {"tls_server_name", &c.tls_server_name}, {"auth_token_file", &c.auth_token_file}};
  for (const auto& [key, field] : passed_to_sdk) {
    if (auto v = get(key)) {
      if (split(*v).empty()) bad(key, "empty: leave the parameter out instead");
      *field = trimmed(*v);
    }
  }
  if (c.tls_cert.empty() != c.tls_key.empty()) bad(c.tls_cert.empty() ? "tls_cert" : "tls_key", "tls_cert and tls_key go together");

  if (auto v = get("observe_joints")) c.observe_joints = split(*v);
  if (c.observe_joints.empty()) bad("observe_joints", "name at least one joint");
  if (auto v = get("actuate_joints")) c.actuate_joints = split(*v);
  if (c.actuate_joints.empty()) bad("actuate_joints", "name at least one joint");

  if (auto v = get("effort_limits")) c.effort_limits = to_doubles("effort_limits", *v);
  if (c.effort_limits.size() != c.actuate_joints.size())
    bad("effort_limits", "one per actuated joint: " + std::to_string(c.actuate_joints.size()) + " expected, " +
                             std::to_string(c.effort_limits.size()) + " given");
  for (double limit : c.effort_limits)
    if (!(limit > 0) || std::isinf(limit)) bad("effort_limits", "each limit must be finite and > 0");

  if (auto v = get("position_limits")) {
    c.position_limits = to_doubles("position_limits", *v);
    if (c.position_limits.size() != c.observe_joints.size())
      bad("position_limits", "one per observed joint (inf: no limit): " +
                                 std::to_string(c.observe_joints.size()) + " expected, " +
                                 std::to_string(c.position_limits.size()) + " given");
    for (double limit : c.position_limits)
      if (!(limit > 0)) bad("position_limits", "each limit must be > 0 (inf: no limit)");
  } else {
    c.position_limits.assign(c.observe_joints.size(), std::numeric_limits<double>::infinity());
  }

  if (auto v = get("action")) {
    const std::string word = trimmed(*v);
    const std::string prefix = "discrete:";
    if (word == "box") {
      c.discrete_actions = 0;
    } else if (word.compare(0, prefix.size(), prefix) == 0) {
      c.discrete_actions = to_int("action", word.substr(prefix.size()), 2);
      if (c.actuate_joints.size() != 1) bad("action", "discrete actions drive exactly one actuated joint");
    } else {
      bad("action", "'" + *v + "': expected 'box' or 'discrete:N' (N >= 2)");
    }
  }
  if (auto v = get("max_episode_steps")) c.max_episode_steps = to_int("max_episode_steps", *v, 0);
  if (auto v = get("steps_per_action")) c.steps_per_action = to_int("steps_per_action", *v, 1);
  if (auto v = get("reset_timeout_steps")) c.reset_timeout_steps = to_int("reset_timeout_steps", *v, 1);
  if (auto v = get("seed")) c.seed = static_cast<uint32_t>(to_int("seed", *v, 0));
  if (auto v = get("reward_per_step")) c.reward_per_step = to_double("reward_per_step", trimmed(*v));
  if (std::isinf(c.reward_per_step)) bad("reward_per_step", "must be finite");
  if (auto v = get("init_noise")) c.init_noise = to_double("init_noise", trimmed(*v));
  if (!(c.init_noise >= 0) || std::isinf(c.init_noise)) bad("init_noise", "must be finite and >= 0");
  if (auto v = get("reset")) {
    const std::string word = trimmed(*v);
    if (word == "world") c.reset = ResetMode::kWorld;
    else if (word == "joints") c.reset = ResetMode::kJoints;
    else bad("reset", "'" + *v + "': expected 'world' or 'joints'");
  }
  if (auto v = get("training")) c.training = to_bool("training", *v);
  parse_camera(get, c);
  return c;
}

SpaceSpec observation_space(const Config& config) {
  SpaceSpec s;
  if (config.observe_camera) s.image = {config.camera.height, config.camera.width, config.camera.channels()};
  s.joints = config.observe_joint_states;
  if (!s.joints) return s;
  for (double limit : config.position_limits) {
    // Twice the end limit, as gymnasium's CartPole: observations just past it still fit the box.
    const float bound = std::isinf(limit) ? kUnbounded : static_cast<float>(2 * limit);
    s.low.insert(s.low.end(), {-bound, -kUnbounded});
    s.high.insert(s.high.end(), {bound, kUnbounded});
  }
  return s;
}

SpaceSpec action_space(const Config& config) {
  SpaceSpec s;
  if (config.discrete_actions > 0) {
    s.discrete = true;
    s.n = config.discrete_actions;
  } else {
    s.low.assign(config.actuate_joints.size(), -1.0f);
    s.high.assign(config.actuate_joints.size(), 1.0f);
  }
  return s;
}

EpisodeDriver::EpisodeDriver(Config config, Agent& agent, Camera* camera)
    : config_(std::move(config)), agent_(agent), camera_(camera), rng_(config_.seed),
      efforts_(config_.actuate_joints.size(), 0.0) {
  if (config_.observe_camera && !camera_) throw std::invalid_argument("the observation holds a camera: pass one");
  draw_start_state();
}

std::vector<double> EpisodeDriver::efforts_for(const Floats& action) const {
  if (config_.discrete_actions > 0) {
    if (action.size() != 1) throw std::out_of_range("a discrete action is one index");
    const double index = action[0];
    if (!(index >= 0) || index >= static_cast<double>(config_.discrete_actions) || index != std::floor(index))
      throw std::out_of_range("discrete action " + std::to_string(index) + " outside [0, " +
                              std::to_string(config_.discrete_actions) + ")");
    // N evenly spaced efforts from -limit to +limit: discrete:2 pushes left or right as CartPole does.
    const double limit = config_.effort_limits[0];
    return {-limit + index * 2 * limit / static_cast<double>(config_.discrete_actions - 1)};
  }
  if (action.size() != config_.actuate_joints.size())
    throw std::out_of_range("the action has " + std::to_string(action.size()) + " values for " +
                            std::to_string(config_.actuate_joints.size()) + " actuated joints");
  std::vector<double> efforts(action.size());
  for (size_t i = 0; i < action.size(); ++i) {
    const double a = std::isnan(action[i]) ? 0.0 : std::clamp(static_cast<double>(action[i]), -1.0, 1.0);
    efforts[i] = a * config_.effort_limits[i];
  }
  return efforts;
}

Command EpisodeDriver::before_step() {
  Command command;
  command.efforts.assign(config_.actuate_joints.size(), 0.0);
  switch (phase_) {
    case Phase::kStarting:
      command.reset_positions = start_positions_;
      command.reset_velocities = start_velocities_;
      break;
    case Phase::kActing:
      command.efforts = efforts_;
      break;
    case Phase::kAwaitingReset:
      // A request can be lost (the world's control service not up yet): ask again after a while.
      if (!reset_requested_ || iterations_waiting_ >= config_.reset_timeout_steps) {
        command.request_world_reset = true;
        reset_requested_ = true;
        iterations_waiting_ = 0;
      }
      ++iterations_waiting_;
      break;
  }
  return command;
}

void EpisodeDriver::after_step(const std::vector<JointReading>& readings, int64_t sim_ns, int64_t step_ns) {
  if (readings.size() != config_.observe_joints.size())
    throw std::invalid_argument("expected " + std::to_string(config_.observe_joints.size()) +
                                " joint readings, got " + std::to_string(readings.size()));
  switch (phase_) {
    case Phase::kAwaitingReset:
      return;   // the old episode's world runs on until the reset lands
    case Phase::kStarting: {
      // The first frame must show the start state: the world holds it (before_step writes it again)
      // until the camera has rendered it, for at most camera_timeout_s.
      const auto now = std::chrono::steady_clock::now();
      if (starting_since_ns_ < 0) {
        starting_since_ns_ = sim_ns;
        starting_wall_ = now;
      }
      auto obs = observe(readings, starting_since_ns_, sim_ns, /*wait=*/false);
      if (!obs) {
        if (now - *starting_wall_ > std::chrono::duration<double>(config_.camera.timeout_s))
          throw CameraError(camera_->missing(starting_since_ns_, seconds_per_action(step_ns)));
        return;
      }
      last_observation_ = std::move(*obs);
      observed_ns_ = sim_ns;
      starting_since_ns_ = -1;
      starting_wall_.reset();
      episode_id_ = agent_.start_episode(config_.training);
      episode_steps_ = 0;
      start_positions_.reset();
      start_velocities_.reset();
      efforts_ = efforts_for(agent_.get_action(episode_id_, last_observation_));
      iterations_since_action_ = 0;
      phase_ = Phase::kActing;
      return;
    }
    case Phase::kActing: {
      if (++iterations_since_action_ < config_.steps_per_action) return;
      ++episode_steps_;
      // By default a frame taken after the previous observation: one a camera at the action's rate
      // always has. camera_max_age asks for a fresher one (0: this iteration's).
      const int64_t not_before = config_.camera.max_age_s < 0
                                     ? observed_ns_ + 1
                                     : sim_ns - static_cast<int64_t>(std::llround(config_.camera.max_age_s * 1e9));
      auto obs = observe(readings, not_before, sim_ns, /*wait=*/true);
      if (!obs) throw CameraError(camera_->missing(not_before, seconds_per_action(step_ns)));
      last_observation_ = std::move(*obs);
      observed_ns_ = sim_ns;
      agent_.log_returns(episode_id_, config_.reward_per_step);
      const bool terminated = beyond_limits(readings);
      const bool truncated = config_.max_episode_steps > 0 && episode_steps_ >= config_.max_episode_steps;
      if (terminated || truncated) {
        end(last_observation_, !terminated);   // a fall at the last step is a fall: no bootstrapping
        return;
      }
      efforts_ = efforts_for(agent_.get_action(episode_id_, last_observation_));
      iterations_since_action_ = 0;
      return;
    }
  }
}

double EpisodeDriver::seconds_per_action(int64_t step_ns) const {
  return static_cast<double>(config_.steps_per_action * step_ns) * 1e-9;
}

void EpisodeDriver::on_world_reset() {
  // Someone else's reset (the GUI, `gz service`) cuts a running episode short: it did not fail.
  if (phase_ == Phase::kActing) end(last_observation_, /*truncated=*/true);
  draw_start_state();
  phase_ = Phase::kStarting;
  observed_ns_ = 0;   // sim time starts again from 0
  starting_since_ns_ = -1;
  starting_wall_.reset();
}

std::optional<Floats> EpisodeDriver::observe(const std::vector<JointReading>& readings, int64_t not_before_ns,
                                             int64_t now_ns, bool wait) {
  Floats obs;
  if (config_.observe_camera) {
    auto frame = camera_->frame(not_before_ns, now_ns, wait ? config_.camera.timeout_s : 0.0);
    if (!frame) return std::nullopt;
    obs.assign(frame->pixels.begin(), frame->pixels.end());   // 0..255 as floats: the SDK sends them as bytes
  }
  if (config_.observe_joint_states) {
    obs.reserve(obs.size() + 2 * readings.size());
    for (const auto& r : readings) {
      obs.push_back(static_cast<float>(r.position));
      obs.push_back(static_cast<float>(r.velocity));
    }
  }
  return obs;
}

bool EpisodeDriver::beyond_limits(const std::vector<JointReading>& readings) const {
  for (size_t i = 0; i < readings.size(); ++i)
    if (std::abs(readings[i].position) > config_.position_limits[i]) return true;
  return false;
}

void EpisodeDriver::end(const Floats& final_observation, bool truncated) {
  agent_.end_episode(episode_id_, final_observation, truncated);
  ++episodes_ended_;
  episode_id_.clear();
  efforts_.assign(config_.actuate_joints.size(), 0.0);
  if (config_.reset == ResetMode::kWorld) {
    phase_ = Phase::kAwaitingReset;
    reset_requested_ = false;
    iterations_waiting_ = 0;
  } else {
    draw_start_state();
    phase_ = Phase::kStarting;
  }
}

void EpisodeDriver::draw_start_state() {
  start_positions_.reset();
  start_velocities_.reset();
  // A world reset already restores the SDF's start state; without noise there is nothing to add.
  if (config_.reset == ResetMode::kWorld && config_.init_noise == 0) return;
  std::uniform_real_distribution<double> noise(-config_.init_noise, config_.init_noise);
  auto draw = [&] { return config_.init_noise > 0 ? noise(rng_) : 0.0; };
  std::vector<double> positions, velocities;
  for (size_t i = 0; i < config_.observe_joints.size(); ++i) {
    positions.push_back(draw());
    velocities.push_back(draw());
  }
  start_positions_ = std::move(positions);
  start_velocities_ = std::move(velocities);
}

}  // namespace simbridge_gz
