// gymnasium's InvertedPendulum-v5 (with gym.make's 1000-step TimeLimit) on MuJoCo's C API.
//
// The same model file, the same physics calls in the same order, so a trajectory from the same
// initial state and actions is the one gymnasium's Python env produces (the MuJoCo library of
// the mujoco-core wheel is the one its Python bindings call):
//   reset:  mj_resetData, qpos = qpos0 + U(-0.01, 0.01)^nq, then qvel = 0 + U(-0.01, 0.01)^nv, mj_forward
//   step:   ctrl = action clipped to the actuator's ctrlrange, frame_skip (2) x mj_step
//   observation (qpos, qvel); terminated when it is not finite or |pole angle| > 0.2;
//   reward 1 when not terminated, else 0; truncated once 1000 steps were taken since the reset.
// The noise comes from this class's own seeded generator, not numpy's, so only the draws differ.
#pragma once

#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

struct mjModel_;
struct mjData_;

namespace simbridge::sims {

class InvertedPendulum {
 public:
  static constexpr int kObservationSize = 4;  // cart position, pole angle, their velocities
  static constexpr int kFrameSkip = 2;
  static constexpr int kMaxEpisodeSteps = 1000;
  static constexpr double kResetNoiseScale = 0.01;
  static constexpr double kHealthyAngle = 0.2;

  using Observation = std::array<double, kObservationSize>;
  struct Outcome {
    Observation observation;
    double reward;
    bool terminated;
    bool truncated;
  };

  // Throws std::runtime_error with MuJoCo's message when the file does not load, and
  // std::invalid_argument when the model is not a cart-pole (2 joints, 1 limited actuator).
  InvertedPendulum(const std::string& model_path, uint64_t seed);
  ~InvertedPendulum();
  InvertedPendulum(const InvertedPendulum&) = delete;
  InvertedPendulum& operator=(const InvertedPendulum&) = delete;

  // A new episode from the model's initial state plus uniform noise.
  Observation reset();
  // A new episode from exactly this state (qpos then qvel).
  Observation reset_to(const Observation& state);
  // Like gymnasium, stepping on after termination is allowed (reward 0); a non-finite action
  // reaches MuJoCo unclipped, as in gymnasium.
  Outcome step(double action);

  double action_low() const { return action_low_; }
  double action_high() const { return action_high_; }
  int episode_steps() const { return episode_steps_; }

 private:
  Observation observation() const;

  mjModel_* model_ = nullptr;
  mjData_* data_ = nullptr;
  std::vector<double> init_qpos_;
  double action_low_ = 0, action_high_ = 0;
  std::mt19937_64 rng_;
  int episode_steps_ = 0;
};

}  // namespace simbridge::sims
