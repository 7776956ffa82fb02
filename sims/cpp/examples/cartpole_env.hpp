// CartPole-v1 in plain C++: gymnasium's dynamics (Euler), termination and 500-step time limit,
// for the examples' lockstep and slot benchmarks. Plus their small command-line parser.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>
#include <random>
#include <string>

#include <simbridge/client.hpp>

namespace cartpole {

constexpr double kGravity = 9.8, kMassCart = 1.0, kMassPole = 0.1, kTotalMass = kMassCart + kMassPole;
constexpr double kLength = 0.5, kPoleMassLength = kMassPole * kLength, kForceMag = 10.0, kTau = 0.02;
constexpr double kThetaThreshold = 12 * 2 * M_PI / 360, kXThreshold = 2.4;
constexpr int kMaxSteps = 500;

// gymnasium's observation space: Box(-high, high), high = [4.8, f32 max, 0.4189, f32 max].
inline simbridge::Space observation_space() {
  simbridge::Floats high{static_cast<float>(kXThreshold * 2), FLT_MAX, static_cast<float>(kThetaThreshold * 2), FLT_MAX};
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

// --name value pairs; unknown names are an error (exit 2).
inline std::map<std::string, std::string> parse_args(int argc, char** argv, std::map<std::string, std::string> defaults) {
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

}  // namespace cartpole
