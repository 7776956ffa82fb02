// PolicyClient: ExternalEnv, one agent per episode, on the bidirectional Stream (client.hpp says
// how every client connects, reconnects and moves between hosts).
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

class RowCalls;

// Calls that return nothing (log_action, end_episode) are pipelined: their errors are raised by
// the next call that reads answers. log_returns is queued and travels with the next
// get_action/log_action/end_episode, so a lockstep step is one message each way.
class PolicyClient {
 public:
  // addresses: one, or several with commas ("h1:p1,h2:p2"); or a list.
  PolicyClient(const std::string& addresses, const Space& observation_space, const Space& action_space,
               ClientOptions options = {});
  PolicyClient(const std::vector<std::string>& addresses, const Space& observation_space, const Space& action_space,
               ClientOptions options = {});
  ~PolicyClient();
  PolicyClient(const PolicyClient&) = delete;
  PolicyClient& operator=(const PolicyClient&) = delete;

  std::string start_episode(bool training_enabled = true);
  // The action as a row (Box: its values; Discrete: one value, the index).
  Floats get_action(const std::string& episode_id, const Floats& observation);
  // The action typed: act(...).index() is a Discrete action's index.
  Action act(const std::string& episode_id, const Floats& observation);
  // N episodes in one round trip: N observation rows in, N action rows (or Actions) out.
  Floats get_actions(const std::vector<std::string>& episode_ids, const Floats& observations);
  std::vector<Action> act(const std::vector<std::string>& episode_ids, const Floats& observations);
  // An action the simulator chose itself (local inference, a scripted or human policy).
  void log_action(const std::string& episode_id, const Floats& observation, const Floats& action);
  void log_action(const std::string& episode_id, const Floats& observation, const Action& action);
  void log_returns(const std::string& episode_id, double reward);
  // stopping: the simulator ends the episode because it stops (a signal, a budget), not its
  // environment: truncated for the learners, but not a return of the policy (episodes_cut).
  void end_episode(const std::string& episode_id, const Floats& final_observation, bool truncated = false,
                   bool stopping = false);
  void flush();  // wait until the server applied every call so far; raise the first error
  void close();

  // The serialized PortablePolicy of the policy serving this session (GetPolicy), for LocalPolicy;
  // empty when the server's version is not newer than known_version.
  std::string get_policy(int64_t known_version = -1);
  std::string session_id() const;
  int64_t last_policy_version() const { return last_policy_version_; }
  int reconnects() const;

 private:
  // get_actions and act share one round trip: the answer decoded into rows or into typed.
  Floats request_actions(const std::vector<std::string>& episode_ids, const Floats& observations,
                         std::vector<Action>* typed);
  Space observation_space_, action_space_;
  std::unique_ptr<RowCalls> rows_;
  int64_t last_policy_version_ = -1;
};

}  // namespace simbridge
