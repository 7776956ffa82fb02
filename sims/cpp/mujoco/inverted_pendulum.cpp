#include "inverted_pendulum.hpp"

#include <mujoco/mujoco.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace simbridge::sims {

InvertedPendulum::InvertedPendulum(const std::string& model_path, uint64_t seed) : rng_(seed) {
  char error[1000] = "";
  model_ = mj_loadXML(model_path.c_str(), nullptr, error, sizeof(error));
  if (!model_) {
    throw std::runtime_error("cannot load MuJoCo model '" + model_path + "': " + error);
  }
  if (model_->nq != 2 || model_->nv != 2 || model_->nu != 1 || !model_->actuator_ctrllimited[0]) {
    int nq = model_->nq, nv = model_->nv, nu = model_->nu;
    mj_deleteModel(model_);
    throw std::invalid_argument("'" + model_path + "' is not an inverted pendulum: nq=" + std::to_string(nq) +
                                " nv=" + std::to_string(nv) + " nu=" + std::to_string(nu) +
                                " (want 2, 2 and 1 actuator with a ctrlrange)");
  }
  data_ = mj_makeData(model_);
  if (!data_) {
    mj_deleteModel(model_);
    throw std::runtime_error("cannot allocate MuJoCo data for '" + model_path + "'");
  }
  // gymnasium's init_qpos: what MjData holds once made (qpos0); init_qvel is zero.
  init_qpos_.assign(data_->qpos, data_->qpos + model_->nq);
  action_low_ = model_->actuator_ctrlrange[0];
  action_high_ = model_->actuator_ctrlrange[1];
}

InvertedPendulum::~InvertedPendulum() {
  mj_deleteData(data_);
  mj_deleteModel(model_);
}

InvertedPendulum::Observation InvertedPendulum::reset() {
  std::uniform_real_distribution<double> noise(-kResetNoiseScale, kResetNoiseScale);
  Observation state{};
  // Drawn in gymnasium's order: all of qpos, then all of qvel.
  for (int i = 0; i < model_->nq; ++i) state[i] = init_qpos_[i] + noise(rng_);
  for (int i = 0; i < model_->nv; ++i) state[model_->nq + i] = noise(rng_);
  return reset_to(state);
}

InvertedPendulum::Observation InvertedPendulum::reset_to(const Observation& state) {
  mj_resetData(model_, data_);
  std::copy(state.begin(), state.begin() + model_->nq, data_->qpos);
  std::copy(state.begin() + model_->nq, state.end(), data_->qvel);
  mj_forward(model_, data_);
  episode_steps_ = 0;
  return observation();
}

InvertedPendulum::Outcome InvertedPendulum::step(double action) {
  // MuJoCo clamps a limited actuator's ctrl itself; clipping here makes the clip explicit and
  // gives the same force. std::max/std::min pass NaN through, so MuJoCo sees it as gymnasium's would.
  data_->ctrl[0] = std::min(std::max(action, action_low_), action_high_);
  for (int i = 0; i < kFrameSkip; ++i) mj_step(model_, data_);
  // (gymnasium then calls mj_rnePostConstraint: it fills cacc/cfrc_*, which the observation never reads.)
  ++episode_steps_;
  Outcome out;
  out.observation = observation();
  bool finite = std::all_of(out.observation.begin(), out.observation.end(), [](double x) { return std::isfinite(x); });
  out.terminated = !finite || std::abs(out.observation[1]) > kHealthyAngle;
  out.reward = out.terminated ? 0.0 : 1.0;
  out.truncated = episode_steps_ >= kMaxEpisodeSteps;
  return out;
}

InvertedPendulum::Observation InvertedPendulum::observation() const {
  Observation obs{};
  std::copy(data_->qpos, data_->qpos + model_->nq, obs.begin());
  std::copy(data_->qvel, data_->qvel + model_->nv, obs.begin() + model_->nq);
  return obs;
}

}  // namespace simbridge::sims
