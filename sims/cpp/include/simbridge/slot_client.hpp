// SlotClient: a batched simulator, n slots, one Step per step, one message each way (per-slot
// auto-reset), on the bidirectional Stream.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "simbridge/action.hpp"
#include "simbridge/error.hpp"
#include "simbridge/options.hpp"
#include "simbridge/space.hpp"

namespace simbridge {

class Connection;

class SlotClient {
 public:
  SlotClient(const std::string& addresses, const Space& observation_space, const Space& action_space,
             int num_slots, ClientOptions options = {});
  SlotClient(const std::vector<std::string>& addresses, const Space& observation_space, const Space& action_space,
             int num_slots, ClientOptions options = {});
  ~SlotClient();
  SlotClient(const SlotClient&) = delete;
  SlotClient& operator=(const SlotClient&) = delete;

  // observations: num_slots rows, row-major (num_slots * obs_size); first call: no outcome.
  // Returns num_slots actions, row-major. terminated/truncated one per slot; final_observations
  // rows for the slots that ended (row-major, in slot order), as the proto's StepRequest says.
  Floats step(const Floats& observations, const Floats& rewards = {}, const std::vector<bool>& terminated = {},
              const std::vector<bool>& truncated = {}, const Floats& final_observations = {});
  // The same step, its num_slots actions typed (action.hpp): act(...)[slot].index() for Discrete.
  std::vector<Action> act(const Floats& observations, const Floats& rewards = {},
                          const std::vector<bool>& terminated = {}, const std::vector<bool>& truncated = {},
                          const Floats& final_observations = {});
  // Report the last outcome (every slot's last observation; slots not terminated end truncated
  // there) and close. Without an outcome (close()) the last actions' transitions are dropped.
  void close(const Floats& rewards, const std::vector<bool>& terminated, const std::vector<bool>& truncated,
             const Floats& last_observations);
  void close();

  const std::vector<int64_t>& policy_versions() const { return policy_versions_; }
  const std::string& policy_id() const { return policy_id_; }
  std::string session_id() const;
  int reconnects() const;

 private:
  // step and act share one round trip: the answer decoded into rows or into typed.
  Floats request_step(const Floats& observations, const Floats& rewards, const std::vector<bool>& terminated,
                      const std::vector<bool>& truncated, const Floats& final_observations, std::vector<Action>* typed);
  Space observation_space_, action_space_;
  int num_slots_;
  std::unique_ptr<Connection> conn_;
  std::vector<int64_t> policy_versions_;
  std::string policy_id_;
};

}  // namespace simbridge
