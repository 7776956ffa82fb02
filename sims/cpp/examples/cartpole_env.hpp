// CartPole-v1 in plain C++: gymnasium's dynamics (Euler), termination and 500-step time limit,
// for the examples' lockstep and slot benchmarks. Plus their small command-line parser and the
// measured window of bench/throughput.py's cpp_* cases (--warmup-s, --seconds).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <simbridge/client.hpp>

namespace cartpole {

constexpr double kGravity = 9.8, kMassCart = 1.0, kMassPole = 0.1, kTotalMass = kMassCart + kMassPole;
constexpr double kLength = 0.5, kPoleMassLength = kMassPole * kLength, kForceMag = 10.0, kTau = 0.02;
constexpr double kThetaThreshold = 12 * 2 * M_PI / 360, kXThreshold = 2.4;
constexpr int kMaxSteps = 500;

// gymnasium's observation space, bit for bit (a trainer takes this program and `simbridge-sim --env
// CartPole-v1` as one policy): Box(-high, high), high = [4.8, inf, 0.4189, inf].
inline simbridge::Space observation_space() {
  const float inf = std::numeric_limits<float>::infinity();
  simbridge::Floats high{static_cast<float>(kXThreshold * 2), inf, static_cast<float>(kThetaThreshold * 2), inf};
  simbridge::Floats low{-high[0], -high[1], -high[2], -high[3]};
  return simbridge::Space::Box(low, high);
}

class Env {
 public:
  explicit Env(uint64_t seed) : rng_(seed) {}

  simbridge::Floats reset() {
    std::uniform_real_distribution<double> u(-0.05, 0.05);
    for (double& v : s_) v = u(rng_);
    steps_ = 0;
    return obs();
  }

  // One step: reward 1; terminated when the pole falls or the cart leaves; truncated at 500 steps.
  simbridge::Floats step(int action, float* reward, bool* terminated, bool* truncated) {
    double x = s_[0], x_dot = s_[1], theta = s_[2], theta_dot = s_[3];
    double force = action == 1 ? kForceMag : -kForceMag;
    double cos_t = std::cos(theta), sin_t = std::sin(theta);
    double temp = (force + kPoleMassLength * theta_dot * theta_dot * sin_t) / kTotalMass;
    double theta_acc = (kGravity * sin_t - cos_t * temp) /
                       (kLength * (4.0 / 3.0 - kMassPole * cos_t * cos_t / kTotalMass));
    double x_acc = temp - kPoleMassLength * theta_acc * cos_t / kTotalMass;
    s_[0] = x + kTau * x_dot;
    s_[1] = x_dot + kTau * x_acc;
    s_[2] = theta + kTau * theta_dot;
    s_[3] = theta_dot + kTau * theta_acc;
    ++steps_;
    *reward = 1.0f;
    *terminated = s_[0] < -kXThreshold || s_[0] > kXThreshold || s_[2] < -kThetaThreshold || s_[2] > kThetaThreshold;
    *truncated = !*terminated && steps_ >= kMaxSteps;
    return obs();
  }

 private:
  simbridge::Floats obs() const {
    return {static_cast<float>(s_[0]), static_cast<float>(s_[1]), static_cast<float>(s_[2]), static_cast<float>(s_[3])};
  }
  std::mt19937_64 rng_;
  double s_[4] = {0, 0, 0, 0};
  int steps_ = 0;
};

// --name value pairs; unknown names are an error (exit 2). The SDK's TLS and token flags
// (simbridge::set_client_flag) are taken too, empty by default: see client_options.
inline std::map<std::string, std::string> parse_args(int argc, char** argv, std::map<std::string, std::string> defaults) {
  for (const char* flag : {"tls-ca", "tls-cert", "tls-key", "tls-server-name", "auth-token-file"}) defaults[flag] = "";
  defaults["connect-timeout"] = "30";  // seconds to find a bridge at (one of) --address
  for (int i = 1; i < argc; i += 2) {
    std::string name = argv[i];
    if (name.rfind("--", 0) != 0 || !defaults.count(name.substr(2)) || i + 1 >= argc) {
      std::cerr << "usage: " << argv[0];
      for (const auto& kv : defaults) std::cerr << " [--" << kv.first << " " << kv.second << "]";
      std::cerr << "\n";
      std::exit(2);
    }
    defaults[name.substr(2)] = argv[i + 1];
  }
  return defaults;
}

// The client's options: its name, and the TLS and token flags that were given.
inline simbridge::ClientOptions client_options(const std::map<std::string, std::string>& args, const std::string& name) {
  simbridge::ClientOptions options;
  options.client_name = name;
  options.connect_timeout_s = std::stod(args.at("connect-timeout"));
  for (const auto& kv : args)
    if (!kv.second.empty()) simbridge::set_client_flag(options, "--" + kv.first, kv.second);
  return options;
}

// A run ended by an error: its last words on stderr and the exit code. TRAINING_OVER (the trainer's
// run reached its end) is a normal end, exit 0; anything else says the message, the reason and the
// gRPC status code's number, exit 1.
inline int exit_on_error(const char* program, const simbridge::Error& e) {
  if (e.reason() == "TRAINING_OVER") {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 0;
  }
  std::fprintf(stderr, "%s: %s (%s) [gRPC status %d]\n", program, e.what(), e.reason().c_str(), static_cast<int>(e.code()));
  return 1;
}

using Clock = std::chrono::steady_clock;

// A warm-up, then a measured window of `seconds`, as bench/throughput.py measures its Python
// clients: only the steps in the window count. With seconds <= 0 it is off (timed() false) and the
// examples run their fixed --episodes / --steps. When the window opens it prints
// {"measuring": true} so the bench can sample the server's CPU time at the same moment.
class Window {
 public:
  Window(double warmup_s, double seconds)
      : timed_(seconds > 0), begin_(Clock::now() + to_duration(warmup_s)), length_(to_duration(seconds)) {}

  bool timed() const { return timed_; }

  // Before each step: opens the window once the warm-up is over; true once a step ended past its end.
  bool over() {
    if (!timed_) return false;
    if (!measuring_ && Clock::now() >= begin_) {
      measuring_ = true;
      t0_ = last_ = Clock::now();
      end_ = t0_ + length_;
      cpu0_ = std::clock();
      std::printf("{\"measuring\": true}\n");
      std::fflush(stdout);
    }
    return measuring_ && last_ >= end_;
  }

  // After each step (one bridge call, [call_start, call_end], for `agent_steps` agents).
  void step_done(Clock::time_point call_start, Clock::time_point call_end, long long agent_steps) {
    if (!measuring_) return;
    lat_ms_.push_back(std::chrono::duration<double, std::milli>(call_end - call_start).count());
    agent_steps_ += agent_steps;
    last_ = Clock::now();
  }

  void episode_done(double episode_return) {
    if (!measuring_) return;
    ++episodes_;
    return_sum_ += episode_return;
  }

  // The window's figures, one JSON line: steps are agent steps, calls the bridge calls timed.
  void print(int reconnects) const {
    double elapsed = std::chrono::duration<double>(last_ - t0_).count();
    double cpu_s = static_cast<double>(std::clock() - cpu0_) / CLOCKS_PER_SEC;  // all threads (Linux)
    size_t calls = lat_ms_.size();
    double mean = 0;
    for (double v : lat_ms_) mean += v;
    std::printf("{\"episodes\": %d, \"steps\": %lld, \"steps_per_s\": %.1f, \"return_mean\": %.3f, "
                "\"reconnects\": %d, \"seconds\": %.4f, \"calls\": %zu, \"calls_per_s\": %.1f, "
                "\"p50_ms\": %.4f, \"p99_ms\": %.4f, \"mean_ms\": %.4f, \"cpu_s\": %.4f}\n",
                episodes_, agent_steps_, elapsed > 0 ? agent_steps_ / elapsed : 0.0,
                episodes_ ? return_sum_ / episodes_ : 0.0, reconnects, elapsed, calls,
                elapsed > 0 ? calls / elapsed : 0.0, percentile(0.5), percentile(0.99),
                calls ? mean / calls : 0.0, cpu_s);
  }

 private:
  static Clock::duration to_duration(double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::max(s, 0.0)));
  }
  // Linear interpolation between closest ranks, as numpy.percentile's default.
  double percentile(double q) const {
    if (lat_ms_.empty()) return 0;
    std::vector<double> v = lat_ms_;
    std::sort(v.begin(), v.end());
    double pos = q * (v.size() - 1);
    size_t lo = static_cast<size_t>(pos), hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (pos - lo);
  }

  bool timed_, measuring_ = false;
  Clock::time_point begin_, t0_, end_, last_;
  Clock::duration length_;
  std::clock_t cpu0_ = 0;
  std::vector<double> lat_ms_;
  long long agent_steps_ = 0;
  int episodes_ = 0;
  double return_sum_ = 0;
};

}  // namespace cartpole
