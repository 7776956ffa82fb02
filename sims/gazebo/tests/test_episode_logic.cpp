// The Gazebo layer's rules, without Gazebo: `test_episode_logic NAME` runs one case (ctest runs
// each as its own test), `--list` prints the names, no argument runs them all.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <iostream>
#include <limits>
#include <sstream>
#include <thread>
#include <stdexcept>
#include <string>
#include <tuple>
#include <map>
#include <utility>
#include <vector>

#include "episode_logic.hpp"

using namespace simbridge_gz;

namespace {

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

#define CHECK(cond)                                                                                \
  do {                                                                                             \
    if (!(cond)) throw Failure(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " #cond); \
  } while (0)

#define CHECK_EQ(a, b)                                                                             \
  do {                                                                                             \
    const auto a_ = (a);                                                                           \
    const auto b_ = (b);                                                                           \
    if (!(a_ == b_)) {                                                                             \
      std::ostringstream msg;                                                                      \
      msg << __FILE__ << ":" << __LINE__ << ": " #a " == " #b ": '" << a_ << "' vs '" << b_ << "'"; \
      throw Failure(msg.str());                                                                    \
    }                                                                                              \
  } while (0)

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::string str(const std::vector<float>& v) {
  std::ostringstream out;
  for (size_t i = 0; i < v.size(); ++i) out << (i ? " " : "") << v[i];
  return out.str();
}

std::string str(const std::vector<double>& v) {
  std::ostringstream out;
  for (size_t i = 0; i < v.size(); ++i) out << (i ? " " : "") << v[i];
  return out.str();
}

// Records what the driver asks of the trainer; actions come from a queue (default: 0.5 each).
struct FakeAgent : Agent {
  std::vector<std::string> calls;
  std::deque<Floats> actions;
  int episodes = 0;
  std::string start_episode(bool training_enabled) override {
    const std::string id = "ep" + std::to_string(++episodes);
    calls.push_back("start " + std::string(training_enabled ? "training" : "no-training") + " -> " + id);
    return id;
  }
  Floats get_action(const std::string& id, const Floats& obs) override {
    calls.push_back("act " + id + " [" + str(obs) + "]");
    if (actions.empty()) return Floats{0.5f};
    Floats a = actions.front();
    actions.pop_front();
    return a;
  }
  void log_returns(const std::string& id, double reward) override {
    std::ostringstream out;
    out << "reward " << id << " " << reward;
    calls.push_back(out.str());
  }
  void end_episode(const std::string& id, const Floats& obs, bool truncated) override {
    calls.push_back("end " + id + " [" + str(obs) + "] " + (truncated ? "truncated" : "terminated"));
  }
  std::vector<std::string> take() { return std::exchange(calls, {}); }
};

std::map<std::string, std::string> cartpole_params() {
  return {{"address", "trainer:50051"},         {"observe_joints", "cart pole"},
          {"actuate_joints", "cart"},           {"effort_limits", "10"},
          {"position_limits", "2.4, 0.21"},     {"max_episode_steps", "500"},
          {"steps_per_action", "1"},            {"init_noise", "0"},
          {"client_name", "gz-cartpole"}};
}

Config cartpole(std::function<void(std::map<std::string, std::string>&)> edit = nullptr) {
  auto params = cartpole_params();
  if (edit) edit(params);
  return parse_config(params);
}

std::vector<JointReading> at(double cart, double pole) { return {{cart, 0.1}, {pole, -0.2}}; }

using Calls = std::vector<std::string>;

std::string joined(const Calls& calls) {
  std::string out;
  for (const auto& c : calls) out += "\n  " + c;
  return out;
}

#define CHECK_CALLS(actual, ...)                                                                   \
  do {                                                                                             \
    const Calls want_ = __VA_ARGS__;                                                               \
    const Calls got_ = (actual);                                                                   \
    if (got_ != want_) throw Failure(std::string(__FILE__) + ":" + std::to_string(__LINE__) +     \
                                     ": calls" + joined(got_) + "\nexpected" + joined(want_));     \
  } while (0)

// ---------------------------------------------------------------------------------------------

void parse_cartpole_params() {
  const Config c = cartpole();
  CHECK_EQ(c.address, std::string("trainer:50051"));
  CHECK_EQ(c.client_name, std::string("gz-cartpole"));
  CHECK(c.observe_joints == (std::vector<std::string>{"cart", "pole"}));
  CHECK(c.actuate_joints == (std::vector<std::string>{"cart"}));
  CHECK_EQ(str(c.effort_limits), std::string("10"));
  CHECK_EQ(str(c.position_limits), std::string("2.4 0.21"));
  CHECK_EQ(c.max_episode_steps, 500);
  CHECK(c.reset == ResetMode::kWorld);
  CHECK_EQ(c.discrete_actions, 0);
  CHECK(c.training);
}

void the_environment_address_wins() {
  CHECK_EQ(parse_config(cartpole_params(), "gpu-box:6000").address, std::string("gpu-box:6000"));
  CHECK_EQ(parse_config(cartpole_params(), "").address, std::string("trainer:50051"));
  CHECK_EQ(parse_config(cartpole_params(), nullptr).address, std::string("trainer:50051"));
  CHECK(error_of([] { parse_config(cartpole_params(), "a b"); }).find("<address>") != std::string::npos);
}

void tls_and_token_parameters_pass_through() {
  Config c = cartpole([](auto& p) {
    p["tls_ca"] = " /etc/simbridge/ca.pem ";
    p["tls_cert"] = "/etc/simbridge/sim.pem";
    p["tls_key"] = "/etc/simbridge/sim.key";
    p["tls_server_name"] = "trainer.lan";
    p["auth_token_file"] = "/etc/simbridge/token";
  });
  CHECK_EQ(c.tls_ca, std::string("/etc/simbridge/ca.pem"));
  CHECK_EQ(c.tls_cert, std::string("/etc/simbridge/sim.pem"));
  CHECK_EQ(c.tls_key, std::string("/etc/simbridge/sim.key"));
  CHECK_EQ(c.tls_server_name, std::string("trainer.lan"));
  CHECK_EQ(c.auth_token_file, std::string("/etc/simbridge/token"));
  const Config plain = parse_config(cartpole_params());
  CHECK(plain.tls_ca.empty() && plain.auth_token_file.empty());
  CHECK(error_of([] { cartpole([](auto& p) { p["tls_cert"] = "sim.pem"; }); }).find("<tls_key>") != std::string::npos);
  CHECK(error_of([] { cartpole([](auto& p) { p["tls_ca"] = " "; }); }).find("<tls_ca>") != std::string::npos);
}

void parse_defaults() {
  const Config c = parse_config({{"observe_joints", "hinge"}, {"actuate_joints", "hinge"}, {"effort_limits", "2"}});
  CHECK_EQ(c.address, std::string("127.0.0.1:50051"));
  CHECK(std::isinf(c.position_limits.at(0)));
  CHECK_EQ(c.steps_per_action, 1);
  CHECK_EQ(c.max_episode_steps, 500);
  CHECK_EQ(c.init_noise, 0.05);
  CHECK_EQ(c.reward_per_step, 1.0);
  CHECK(c.reset == ResetMode::kWorld);
  CHECK_EQ(c.connect_timeout_s, 30.0);
  CHECK_EQ(cartpole([](auto& p) { p["connect_timeout_s"] = " 600 "; }).connect_timeout_s, 600.0);
}

void parse_rejects_bad_parameters() {
  // Each bad value is refused with the parameter's name, never silently replaced by a default.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"observe_joints", ""},        {"actuate_joints", " "},          {"effort_limits", "10 10"},
      {"effort_limits", "0"},        {"effort_limits", "inf"},         {"effort_limits", "ten"},
      {"position_limits", "2.4"},    {"position_limits", "2.4 -1"},    {"position_limits", "2.4 nan"},
      {"action", "continuous"},      {"action", "discrete:1"},         {"action", "discrete:x"},
      {"max_episode_steps", "-1"},   {"steps_per_action", "0"},        {"steps_per_action", "1.5"},
      {"init_noise", "-0.1"},        {"reset", "model"},               {"training", "yes"},
      {"address", "a:1 b:2"},        {"reward_per_step", "inf"},       {"seed", "-3"},
      {"reset_timeout_steps", "0"},  {"init_noise", "0.1 0.2"},      {"connect_timeout_s", "0"},
      {"connect_timeout_s", "inf"},  {"connect_timeout_s", "soon"},
  };
  for (const auto& [key, value] : cases) {
    const std::string err = error_of([&, key = key, value = value] {
      cartpole([&](auto& p) { p[key] = value; });
    });
    if (err.find("<" + key + ">") == std::string::npos)
      throw Failure("<" + key + ">='" + value + "' was not refused by name: '" + err + "'");
  }
  CHECK(error_of([] { cartpole([](auto& p) { p["obs_joints"] = "x"; }); }).find("unknown") != std::string::npos);
  CHECK(error_of([] { parse_config({{"observe_joints", "a"}, {"actuate_joints", "a b"}, {"effort_limits", "1 1"},
                                    {"action", "discrete:3"}}); })
            .find("exactly one") != std::string::npos);
}

void spaces_box_and_discrete() {
  const Config c = cartpole();
  const SpaceSpec obs = observation_space(c);
  CHECK(!obs.discrete);
  CHECK_EQ(obs.low.size(), size_t(4));   // x, x_dot, theta, theta_dot
  CHECK_EQ(obs.high[0], 4.8f);
  CHECK_EQ(obs.high[2], 0.42f);
  CHECK(std::isinf(obs.high[1]) && obs.high[1] > 0);
  CHECK_EQ(obs.low[2], -0.42f);
  const SpaceSpec box = action_space(c);
  CHECK(!box.discrete && box.low == Floats{-1.0f} && box.high == Floats{1.0f});
  const SpaceSpec disc = action_space(cartpole([](auto& p) { p["action"] = "discrete:2"; }));
  CHECK(disc.discrete && disc.n == 2);
}

void actions_become_clamped_efforts() {
  FakeAgent agent;
  EpisodeDriver box(cartpole(), agent);
  CHECK_EQ(str(box.efforts_for({0.25f})), std::string("2.5"));
  CHECK_EQ(str(box.efforts_for({7.0f})), std::string("10"));
  CHECK_EQ(str(box.efforts_for({-3.0f})), std::string("-10"));
  CHECK_EQ(str(box.efforts_for({std::nanf("")})), std::string("0"));
  CHECK(!error_of([&] { box.efforts_for({0.1f, 0.2f}); }).empty());
  EpisodeDriver two(cartpole([](auto& p) { p["action"] = "discrete:2"; }), agent);
  CHECK_EQ(str(two.efforts_for({0})), std::string("-10"));
  CHECK_EQ(str(two.efforts_for({1})), std::string("10"));
  EpisodeDriver three(cartpole([](auto& p) { p["action"] = "discrete:3"; }), agent);
  CHECK_EQ(str(three.efforts_for({1})), std::string("0"));
  for (float bad : {-1.0f, 3.0f, 0.5f, std::nanf("")})
    CHECK(!error_of([&] { three.efforts_for({bad}); }).empty());
}

void episode_acts_holds_and_ends_on_a_limit() {
  FakeAgent agent;
  agent.actions = {{0.5f}, {-1.0f}};
  EpisodeDriver d(cartpole([](auto& p) { p["steps_per_action"] = "2"; }), agent);
  // No noise in world mode: the world's own start state, nothing written.
  Command c = d.before_step();
  CHECK(!c.reset_positions && !c.reset_velocities && !c.request_world_reset);
  CHECK_EQ(str(c.efforts), std::string("0"));
  d.after_step(at(0, 0.01));
  CHECK_CALLS(agent.take(), {"start training -> ep1", "act ep1 [0 0.1 0.01 -0.2]"});
  // The action is held for steps_per_action iterations: one reward per action, not per iteration.
  CHECK_EQ(str(d.before_step().efforts), std::string("5"));
  d.after_step(at(0.1, 0.02));
  CHECK_CALLS(agent.take(), {});
  CHECK_EQ(str(d.before_step().efforts), std::string("5"));
  d.after_step(at(0.2, 0.05));
  CHECK_CALLS(agent.take(), {"reward ep1 1", "act ep1 [0.2 0.1 0.05 -0.2]"});
  CHECK_EQ(str(d.before_step().efforts), std::string("-10"));
  d.after_step(at(0.3, 0.15));
  d.before_step();
  d.after_step(at(0.4, -0.25));   // the pole passes 0.21 rad: terminated, final observation is this one
  CHECK_CALLS(agent.take(), {"reward ep1 1", "end ep1 [0.4 0.1 -0.25 -0.2] terminated"});
  CHECK(d.phase() == EpisodeDriver::Phase::kAwaitingReset);
  CHECK_EQ(d.episode_steps(), 2);
  CHECK_EQ(d.episodes_ended(), 1);
}

void world_reset_is_requested_once_then_again_after_a_timeout() {
  FakeAgent agent;
  EpisodeDriver d(cartpole([](auto& p) { p["reset_timeout_steps"] = "3"; }), agent);
  d.before_step();
  d.after_step(at(0, 0));
  d.before_step();
  d.after_step(at(3.0, 0));   // the cart leaves the track
  agent.take();
  std::vector<bool> requests;
  for (int i = 0; i < 7; ++i) {
    const Command c = d.before_step();
    CHECK_EQ(str(c.efforts), std::string("0"));   // no push while the old world runs on
    requests.push_back(c.request_world_reset);
    d.after_step(at(3.5, 0));                      // readings while waiting are ignored
  }
  CHECK(requests == (std::vector<bool>{true, false, false, true, false, false, true}));
  CHECK_CALLS(agent.take(), {});
  d.on_world_reset();
  CHECK(d.phase() == EpisodeDriver::Phase::kStarting);
  CHECK(!d.before_step().request_world_reset);
  d.after_step(at(0, 0));
  CHECK_CALLS(agent.take(), {"start training -> ep2", "act ep2 [0 0.1 0 -0.2]"});
}

void truncates_at_max_episode_steps() {
  FakeAgent agent;
  EpisodeDriver d(cartpole([](auto& p) { p["max_episode_steps"] = "3"; p["training"] = "false"; }), agent);
  for (int i = 0; i < 4; ++i) {
    d.before_step();
    d.after_step(at(0.01 * i, 0));
  }
  CHECK_CALLS(agent.take(), {"start no-training -> ep1", "act ep1 [0 0.1 0 -0.2]", "reward ep1 1",
                             "act ep1 [0.01 0.1 0 -0.2]", "reward ep1 1", "act ep1 [0.02 0.1 0 -0.2]",
                             "reward ep1 1", "end ep1 [0.03 0.1 0 -0.2] truncated"});
}

void a_fall_on_the_last_step_is_terminated() {
  FakeAgent agent;
  EpisodeDriver d(cartpole([](auto& p) { p["max_episode_steps"] = "1"; }), agent);
  d.before_step();
  d.after_step(at(0, 0));
  d.before_step();
  d.after_step(at(0, 0.5));
  const Calls calls = agent.take();
  CHECK_EQ(calls.back(), std::string("end ep1 [0 0.1 0.5 -0.2] terminated"));
}

void joint_reset_mode_restarts_at_once_with_seeded_noise() {
  auto run = [](uint32_t seed) {
    FakeAgent agent;
    EpisodeDriver d(cartpole([&](auto& p) {
      p["reset"] = "joints";
      p["init_noise"] = "0.05";
      p["seed"] = std::to_string(seed);
    }), agent);
    std::vector<std::vector<double>> starts;
    for (int episode = 0; episode < 3; ++episode) {
      const Command c = d.before_step();
      CHECK(c.reset_positions && c.reset_velocities && !c.request_world_reset);
      CHECK_EQ(c.reset_positions->size(), size_t(2));
      for (double x : *c.reset_positions) CHECK(std::abs(x) <= 0.05);
      for (double v : *c.reset_velocities) CHECK(std::abs(v) <= 0.05);
      // Written again until the first observation shows it took.
      CHECK(*d.before_step().reset_positions == *c.reset_positions);
      starts.push_back(*c.reset_positions);
      d.after_step(at(0, 0));
      CHECK(!d.before_step().reset_positions);
      d.after_step(at(0, 1.0));   // falls: the next episode starts without any world reset
      CHECK(d.phase() == EpisodeDriver::Phase::kStarting);
    }
    CHECK(starts[0] != starts[1]);
    return starts;
  };
  CHECK(run(7) == run(7));
  CHECK(run(7) != run(8));
}

void world_mode_noise_is_written_after_each_reset() {
  FakeAgent agent;
  EpisodeDriver d(cartpole([](auto& p) { p["init_noise"] = "0.05"; }), agent);
  CHECK(d.before_step().reset_positions);
  d.after_step(at(0, 0));
  d.before_step();
  d.after_step(at(0, 1.0));
  CHECK(!d.before_step().reset_positions);   // awaiting the reset: the old world is left alone
  d.on_world_reset();
  CHECK(d.before_step().reset_positions);
}

void an_outside_reset_truncates_the_running_episode() {
  FakeAgent agent;
  EpisodeDriver d(cartpole(), agent);
  d.before_step();
  d.after_step(at(0, 0));
  d.before_step();
  d.after_step(at(0.5, 0.1));
  agent.take();
  d.on_world_reset();   // the GUI's reset button, mid-episode
  CHECK_CALLS(agent.take(), {"end ep1 [0.5 0.1 0.1 -0.2] truncated"});
  d.on_world_reset();   // a second one before any step ends nothing more
  CHECK_CALLS(agent.take(), {});
  d.before_step();
  d.after_step(at(0, 0));
  CHECK_EQ(agent.take().front(), std::string("start training -> ep2"));
}

void readings_must_match_the_observed_joints() {
  FakeAgent agent;
  EpisodeDriver d(cartpole(), agent);
  CHECK(error_of([&] { d.after_step({{0, 0}}); }).find("expected 2 joint readings") != std::string::npos);
  CHECK_CALLS(agent.take(), {});
}


// ---- cameras -----------------------------------------------------------------------------------

std::map<std::string, std::string> with_camera(std::map<std::string, std::string> p) {
  p["camera_topic"] = "/pole/camera";
  p["camera_width"] = "3";
  p["camera_height"] = "2";
  p["camera_format"] = "L8";
  return p;
}

void parse_camera_params() {
  const Config none = cartpole();
  CHECK(!none.observe_camera && none.observe_joint_states && none.camera.topic.empty());
  const Config c = parse_config(with_camera(cartpole_params()));
  CHECK_EQ(c.camera.topic, std::string("/pole/camera"));
  CHECK(c.camera.width == 3 && c.camera.height == 2 && c.camera.channels() == 1);
  CHECK(c.observe_camera && c.observe_joint_states);   // a camera joins the joints by default
  CHECK(c.camera.timeout_s == 5 && c.camera.max_age_s < 0);
  auto p = with_camera(cartpole_params());
  p.erase("camera_format");
  p["observation"] = "camera";
  p["camera_max_age"] = "0";
  const Config only = parse_config(p);
  CHECK(only.observe_camera && !only.observe_joint_states && only.camera.channels() == 3 && only.camera.max_age_s == 0);
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"camera_width", "0", "must be >= 1"},        {"camera_height", "tall", "not an integer"},
      {"camera_format", "L16", "R8G8B8, B8G8R8, L8"}, {"camera_format", "R_FLOAT32", "8-bit"},
      {"camera_timeout_s", "0", "> 0"},            {"camera_max_age", "-1", ">= 0"},
      {"camera_timeout_s", "1e300", "at most 1e6"}, {"camera_max_age", "inf", "at most 1e6"},
      {"observation", "pixels", "'pixels'"},       {"observation", " ", "name 'joints'"},
      {"camera_topic", "/a /b", "one word"},
  };
  for (const auto& [key, value, says] : cases) {
    auto q = with_camera(cartpole_params());
    q[key] = value;
    const std::string err = error_of([&] { parse_config(q); });
    if (err.find("<" + key + ">") == std::string::npos || err.find(says) == std::string::npos)
      throw Failure("<" + key + ">='" + value + "': '" + err + "'");
  }
  // The camera's keys without a camera, and a camera without its size, are named.
  CHECK(error_of([] { cartpole([](auto& q) { q["camera_width"] = "3"; }); }).find("needs <camera_topic>") !=
        std::string::npos);
  CHECK(error_of([] { cartpole([](auto& q) { q["observation"] = "camera"; }); }).find("needs <camera_topic>") !=
        std::string::npos);
  CHECK(error_of([] { cartpole([](auto& q) { q["camera_topic"] = "/c"; }); }).find("<image><width>") !=
        std::string::npos);
}

void spaces_with_a_camera() {
  const SpaceSpec both = observation_space(parse_config(with_camera(cartpole_params())));
  CHECK(both.image == (std::vector<int64_t>{2, 3, 1}) && both.joints && both.low.size() == 4);
  auto p = with_camera(cartpole_params());
  p["observation"] = "camera";
  p["camera_format"] = "R8G8B8";
  const SpaceSpec image = observation_space(parse_config(p));
  CHECK(image.image == (std::vector<int64_t>{2, 3, 3}) && !image.joints && image.low.empty());
}

CameraConfig small_camera(double timeout_s = 2) {
  CameraConfig c;
  c.topic = "/cam";
  c.width = 2;
  c.height = 2;
  c.format = "R8G8B8";
  c.timeout_s = timeout_s;
  return c;
}

void frame_buffer_packs_rows_and_names_a_mismatch() {
  FrameBuffer buffer(small_camera());
  // Rows of 6 bytes padded to a step of 8, as a sensor may send them.
  buffer.offer(2, 2, 8, 3, std::string("abcdefXXghijklYY"), 7);
  const auto frame = buffer.frame(7, 7, 0);
  CHECK(frame && frame->stamp_ns == 7);
  CHECK_EQ(std::string(frame->pixels.begin(), frame->pixels.end()), std::string("abcdefghijkl"));
  FrameBuffer wrong(small_camera());
  wrong.offer(4, 2, 12, 1, std::string(24, 'x'), 9);
  const std::string said = error_of([&] { wrong.frame(0, 9, 0); });
  CHECK(said.find("sends 4x2 L8 images, the plugin expects 2x2 R8G8B8") != std::string::npos);
  CHECK(said.find("<camera_width>") != std::string::npos);
  FrameBuffer depth(small_camera());
  depth.offer(2, 2, 8, 13, std::string(32, 'x'), 9);
  CHECK(error_of([&] { depth.frame(0, 9, 0); }).find("pixel format 13") != std::string::npos);
  FrameBuffer cut(small_camera());
  cut.offer(2, 2, 6, 3, std::string(11, 'x'), 9);
  CHECK(error_of([&] { cut.frame(0, 9, 0); }).find("sent 11 bytes") != std::string::npos);
}

void frame_buffer_waits_for_a_frame_late_enough() {
  FrameBuffer buffer(small_camera());
  CHECK(buffer.missing(0, 0.02).find("Sensors system") != std::string::npos);   // nothing ever came
  CHECK(!buffer.frame(10, 10, 0));
  buffer.offer(2, 2, 6, 3, std::string(12, 'a'), 5);
  CHECK(!buffer.frame(10, 10, 0));        // too old for 10
  CHECK(buffer.frame(5, 5, 0));
  CHECK(!buffer.frame(0, 4, 0));          // later than now: an old timeline's
  const std::string slow = buffer.missing(10'000'000, 0.02);
  CHECK(slow.find("at least 50 Hz") != std::string::npos && slow.find("<camera_max_age>") != std::string::npos);
  // A frame offered from another thread (gz-transport's) wakes the waiting one.
  std::thread camera([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    buffer.offer(2, 2, 6, 3, std::string(12, 'b'), 10);
  });
  const auto start = std::chrono::steady_clock::now();
  const auto frame = buffer.frame(10, 10, 10.0);
  camera.join();
  CHECK(frame && frame->stamp_ns == 10 && frame->pixels[0] == 'b');
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  buffer.clear();                          // a world reset: sim time starts again
  CHECK(!buffer.frame(0, 100, 0));
}

// Frames by stamp, as a camera would have sent them.
struct FakeCamera : Camera {
  std::vector<Frame> sent;
  std::optional<Frame> frame(int64_t not_before_ns, int64_t not_after_ns, double) override {
    if (sent.empty() || sent.back().stamp_ns < not_before_ns || sent.back().stamp_ns > not_after_ns)
      return std::nullopt;
    return sent.back();
  }
  std::string missing(int64_t not_before_ns, double seconds_per_action) override {
    std::ostringstream out;
    out << "no frame at " << not_before_ns << " for " << seconds_per_action << " s actions";
    return out.str();
  }
  void at(int64_t stamp, uint8_t value) { sent.push_back({std::vector<uint8_t>(6, value), stamp}); }
};

void a_camera_frame_joins_the_observation_and_holds_the_start_until_it_shows_it() {
  FakeAgent agent;
  FakeCamera camera;
  auto p = with_camera(cartpole_params());
  p["reset"] = "joints";
  p["steps_per_action"] = "2";
  EpisodeDriver d(parse_config(p), agent, &camera);
  const int64_t ms = 1'000'000;
  CHECK(d.before_step().reset_positions);
  d.after_step(at(0, 0), 10 * ms, 10 * ms);     // no frame of the start state yet: no episode
  CHECK_CALLS(agent.take(), {});
  CHECK(d.phase() == EpisodeDriver::Phase::kStarting);
  CHECK(d.before_step().reset_positions);         // the start state is held meanwhile
  camera.at(10 * ms, 9);
  d.after_step(at(0, 0.01), 20 * ms, 10 * ms);
  CHECK_CALLS(agent.take(), {"start training -> ep1", "act ep1 [9 9 9 9 9 9 0 0.1 0.01 -0.2]"});
  d.before_step();
  d.after_step(at(0.1, 0.02), 30 * ms, 10 * ms);
  camera.at(30 * ms, 7);                           // taken after the last observation (20 ms): current
  d.before_step();
  d.after_step(at(0.2, 0.03), 40 * ms, 10 * ms);
  CHECK_CALLS(agent.take(), {"reward ep1 1", "act ep1 [7 7 7 7 7 7 0.2 0.1 0.03 -0.2]"});
  d.before_step();
  d.after_step(at(0.3, 0.04), 50 * ms, 10 * ms);
  d.before_step();                                 // no frame since 40 ms: the camera is too slow
  CHECK_EQ(error_of([&] { d.after_step(at(0.4, 0.05), 60 * ms, 10 * ms); }),
           std::string("no frame at 40000001 for 0.02 s actions"));
}

void camera_max_age_zero_wants_this_iterations_frame_and_a_camera_only_observation() {
  FakeAgent agent;
  FakeCamera camera;
  auto p = with_camera(cartpole_params());
  p["observation"] = "camera";
  p["camera_max_age"] = "0";
  EpisodeDriver d(parse_config(p), agent, &camera);
  camera.at(10, 1);
  d.before_step();
  d.after_step(at(0, 0), 10, 10);
  CHECK_CALLS(agent.take(), {"start training -> ep1", "act ep1 [1 1 1 1 1 1]"});
  camera.at(15, 2);                                // older than this iteration (20)
  d.before_step();
  CHECK(error_of([&] { d.after_step(at(0, 0.01), 20, 10); }).find("no frame at 20") != std::string::npos);
}

void a_frame_stamped_after_now_is_an_old_timelines_and_not_taken() {
  // A render in flight at a world reset arrives after it, stamped with the old, later sim time.
  FakeAgent agent;
  FakeCamera camera;
  EpisodeDriver d(parse_config(with_camera(cartpole_params())), agent, &camera);
  d.on_world_reset();
  camera.at(5'000, 4);
  d.before_step();
  d.after_step(at(0, 0), 10, 10);
  CHECK_CALLS(agent.take(), {});
  camera.at(20, 6);
  d.before_step();
  d.after_step(at(0, 0.01), 20, 10);
  CHECK_CALLS(agent.take(), {"start training -> ep1", "act ep1 [6 6 6 6 6 6 0 0.1 0.01 -0.2]"});
}

void a_camera_that_never_shows_the_start_state_stops_the_plugin_after_its_timeout() {
  FakeAgent agent;
  FakeCamera camera;
  auto p = with_camera(cartpole_params());
  p["camera_timeout_s"] = "0.05";
  EpisodeDriver d(parse_config(p), agent, &camera);
  d.before_step();
  d.after_step(at(0, 0), 10, 10);
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  d.before_step();
  CHECK(error_of([&] { d.after_step(at(0, 0), 20, 10); }).find("no frame at 10") != std::string::npos);
  CHECK_CALLS(agent.take(), {});
  CHECK(!error_of([&] { EpisodeDriver no_camera(parse_config(p), agent); }).empty());
}

const std::vector<std::pair<std::string, void (*)()>> kCases = {
    {"parse_cartpole_params", parse_cartpole_params},
    {"the_environment_address_wins", the_environment_address_wins},
    {"tls_and_token_parameters_pass_through", tls_and_token_parameters_pass_through},
    {"parse_defaults", parse_defaults},
    {"parse_rejects_bad_parameters", parse_rejects_bad_parameters},
    {"spaces_box_and_discrete", spaces_box_and_discrete},
    {"actions_become_clamped_efforts", actions_become_clamped_efforts},
    {"episode_acts_holds_and_ends_on_a_limit", episode_acts_holds_and_ends_on_a_limit},
    {"world_reset_is_requested_once_then_again_after_a_timeout",
     world_reset_is_requested_once_then_again_after_a_timeout},
    {"truncates_at_max_episode_steps", truncates_at_max_episode_steps},
    {"a_fall_on_the_last_step_is_terminated", a_fall_on_the_last_step_is_terminated},
    {"joint_reset_mode_restarts_at_once_with_seeded_noise", joint_reset_mode_restarts_at_once_with_seeded_noise},
    {"world_mode_noise_is_written_after_each_reset", world_mode_noise_is_written_after_each_reset},
    {"an_outside_reset_truncates_the_running_episode", an_outside_reset_truncates_the_running_episode},
    {"readings_must_match_the_observed_joints", readings_must_match_the_observed_joints},
    {"parse_camera_params", parse_camera_params},
    {"spaces_with_a_camera", spaces_with_a_camera},
    {"frame_buffer_packs_rows_and_names_a_mismatch", frame_buffer_packs_rows_and_names_a_mismatch},
    {"frame_buffer_waits_for_a_frame_late_enough", frame_buffer_waits_for_a_frame_late_enough},
    {"a_camera_frame_joins_the_observation_and_holds_the_start_until_it_shows_it",
     a_camera_frame_joins_the_observation_and_holds_the_start_until_it_shows_it},
    {"camera_max_age_zero_wants_this_iterations_frame_and_a_camera_only_observation",
     camera_max_age_zero_wants_this_iterations_frame_and_a_camera_only_observation},
    {"a_frame_stamped_after_now_is_an_old_timelines_and_not_taken", a_frame_stamped_after_now_is_an_old_timelines_and_not_taken},
    {"a_camera_that_never_shows_the_start_state_stops_the_plugin_after_its_timeout",
     a_camera_that_never_shows_the_start_state_stops_the_plugin_after_its_timeout},
};

}  // namespace

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  if (only == "--list") {
    for (const auto& [name, fn] : kCases) std::cout << name << "\n";
    return 0;
  }
  int failed = 0, ran = 0;
  for (const auto& [name, fn] : kCases) {
    if (!only.empty() && name != only) continue;
    ++ran;
    try {
      fn();
      std::cout << "ok   " << name << "\n";
    } catch (const std::exception& e) {
      ++failed;
      std::cout << "FAIL " << name << ": " << e.what() << "\n";
    }
  }
  if (ran == 0) {
    std::cerr << "no test case named '" << only << "'\n";
    return 2;
  }
  return failed ? 1 : 0;
}
