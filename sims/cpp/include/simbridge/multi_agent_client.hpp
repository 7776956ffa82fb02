// MultiAgentPolicyClient: ExternalMultiAgentEnv, many agents per episode keyed by agent id (RLlib's
// ExternalMultiAgentEnv), on the bidirectional Stream.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "simbridge/action.hpp"
#include "simbridge/error.hpp"
#include "simbridge/options.hpp"
#include "simbridge/space.hpp"

namespace simbridge {

class RowCalls;

using AgentRows = std::map<std::string, Floats>;
using AgentActions = std::map<std::string, Action>;

// Only agents given an observation act; rewards add up per agent until its next action. `agents`
// names agents whose spaces differ from the defaults.
class MultiAgentPolicyClient {
 public:
  MultiAgentPolicyClient(const std::string& addresses, const Space& observation_space, const Space& action_space,
                         ClientOptions options = {},
                         std::map<std::string, std::pair<Space, Space>> agents = {});
  MultiAgentPolicyClient(const std::vector<std::string>& addresses, const Space& observation_space,
                         const Space& action_space, ClientOptions options = {},
                         std::map<std::string, std::pair<Space, Space>> agents = {});
  ~MultiAgentPolicyClient();
  MultiAgentPolicyClient(const MultiAgentPolicyClient&) = delete;
  MultiAgentPolicyClient& operator=(const MultiAgentPolicyClient&) = delete;

  std::string start_episode(bool training_enabled = true);
  AgentRows get_action(const std::string& episode_id, const AgentRows& observations);
  AgentActions act(const std::string& episode_id, const AgentRows& observations);  // typed (action.hpp)
  void log_action(const std::string& episode_id, const AgentRows& observations, const AgentRows& actions);
  // terminated/truncated end agents early; final_observations are those agents' last
  // observations (needed for truncated ones). Flags are sent at once, plain rewards are queued.
  void log_returns(const std::string& episode_id, const std::map<std::string, double>& rewards,
                   const std::map<std::string, bool>& terminated = {},
                   const std::map<std::string, bool>& truncated = {}, const AgentRows& final_observations = {});
  // stopping: as PolicyClient::end_episode's.
  void end_episode(const std::string& episode_id, const AgentRows& final_observations = {}, bool truncated = false,
                   bool stopping = false);
  void flush();
  void close();
  std::string session_id() const;

 private:
  // get_action and act share one round trip: the answer decoded into rows or into typed.
  AgentRows request_actions(const std::string& episode_id, const AgentRows& observations, AgentActions* typed);
  const Space& space_of(const std::string& agent_id, int which) const;
  std::vector<std::vector<std::string>> groups(const std::vector<std::string>& agent_ids) const;
  Space observation_space_, action_space_;
  std::map<std::string, std::pair<Space, Space>> agents_;
  std::unique_ptr<RowCalls> rows_;
};

}  // namespace simbridge
