// LocalPolicy: a downloaded PortablePolicy (PolicyClient::get_policy) run in plain C++, so a
// simulator can act without a round trip and report its actions with log_action.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "simbridge/action.hpp"
#include "simbridge/error.hpp"
#include "simbridge/space.hpp"

namespace simbridge {

// "flatten" preprocessing, dense layers (linear/relu/tanh) and the action head (q_argmax with
// epsilon and optional action masks, tanh_gaussian, random), as simbridge/client/local_policy.py
// computes it.
class LocalPolicy {
 public:
  explicit LocalPolicy(const std::string& serialized_portable_policy, uint64_t seed = 0);
  ~LocalPolicy();
  LocalPolicy(LocalPolicy&&) noexcept;
  LocalPolicy& operator=(LocalPolicy&&) noexcept;

  // One observation row -> one action row; last_logp() is its log-probability (NaN if unknown).
  Floats act(const Floats& observation);
  // The same, typed (action.hpp): act_typed(obs).index() for a Discrete action space.
  Action act_typed(const Floats& observation);
  double last_logp() const;
  // One flattened observation -> the network's output (Q-values or [mean, log_std]).
  Floats forward(const Floats& flat_observation) const;

  const Space& observation_space() const;
  const Space& action_space() const;
  const std::string& policy_id() const;
  int64_t version() const;
  const std::string& head_kind() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace simbridge
