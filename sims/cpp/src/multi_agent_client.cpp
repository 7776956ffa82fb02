// MultiAgentPolicyClient (ExternalMultiAgentEnv): per-agent maps, as simbridge/client/policy_client.py's
// MultiAgentPolicyClient. Agents with their own spaces travel in AgentRows of their own; the rest
// share one.
#include <algorithm>

#include "hosts.hpp"
#include "row_calls.hpp"

namespace simbridge {

namespace {

Floats stack(const std::vector<std::string>& aids, const AgentRows& values) {
  Floats out;
  for (const auto& aid : aids) {
    auto it = values.find(aid);
    if (it == values.end()) throw invalid_request("no value for agent " + aid);
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
  return out;
}

std::vector<std::string> keys(const AgentRows& values) {
  std::vector<std::string> out;
  for (const auto& kv : values) out.push_back(kv.first);
  return out;
}

}  // namespace

MultiAgentPolicyClient::MultiAgentPolicyClient(const std::string& addresses, const Space& observation_space,
                                               const Space& action_space, ClientOptions options,
                                               std::map<std::string, std::pair<Space, Space>> agents)
    : MultiAgentPolicyClient(parse_addresses(addresses), observation_space, action_space, std::move(options),
                             std::move(agents)) {}

MultiAgentPolicyClient::MultiAgentPolicyClient(const std::vector<std::string>& addresses,
                                               const Space& observation_space, const Space& action_space,
                                               ClientOptions options,
                                               std::map<std::string, std::pair<Space, Space>> agents)
    : observation_space_(observation_space), action_space_(action_space), agents_(std::move(agents)) {
  pb::CreateSessionRequest create = create_request(options, observation_space, action_space);
  for (const auto& [aid, spaces] : agents_) {
    auto* spec = create.add_agents();
    spec->set_agent_id(aid);
    space_to_proto(spaces.first, spec->mutable_observation_space());
    space_to_proto(spaces.second, spec->mutable_action_space());
  }
  rows_ = std::make_unique<RowCalls>(addresses, Service::Multi, std::move(create), options);
}

MultiAgentPolicyClient::~MultiAgentPolicyClient() {
  try {
    close();
  } catch (...) {
  }
}

const Space& MultiAgentPolicyClient::space_of(const std::string& agent_id, int which) const {
  auto it = agents_.find(agent_id);
  if (it == agents_.end()) return which == 0 ? observation_space_ : action_space_;
  return which == 0 ? it->second.first : it->second.second;
}

std::vector<std::vector<std::string>> MultiAgentPolicyClient::groups(const std::vector<std::string>& agent_ids) const {
  std::vector<std::vector<std::string>> out;
  std::vector<std::string> defaults;
  for (const auto& aid : agent_ids) {
    if (agents_.count(aid)) out.push_back({aid});
    else defaults.push_back(aid);
  }
  if (!defaults.empty()) out.insert(out.begin(), defaults);
  return out;
}

std::string MultiAgentPolicyClient::start_episode(bool training_enabled) {
  return rows_->start_episode(training_enabled);
}

AgentRows MultiAgentPolicyClient::get_action(const std::string& episode_id, const AgentRows& observations) {
  return request_actions(episode_id, observations, nullptr);
}

AgentActions MultiAgentPolicyClient::act(const std::string& episode_id, const AgentRows& observations) {
  AgentActions typed;
  request_actions(episode_id, observations, &typed);
  return typed;
}

AgentRows MultiAgentPolicyClient::request_actions(const std::string& episode_id, const AgentRows& observations,
                                                  AgentActions* typed) {
  auto grouped = groups(keys(observations));
  pb::StreamRequest req;
  auto* msg = req.mutable_get_action();
  for (const auto& aids : grouped) {
    auto* rows = msg->add_rows();
    rows->add_episode_ids(episode_id);
    for (const auto& aid : aids) rows->add_agent_ids(aid);
    const Space& space = space_of(aids[0], 0);
    Floats obs = stack(aids, observations);
    check_rows(space, obs.size(), aids.size(), "observations");
    fill_value(rows->mutable_observations(), space, obs.data(), aids.size(), "observations");
  }
  auto resp = rows_->call(std::move(req), true);
  if (resp->get_action().actions_size() != static_cast<int>(grouped.size()))
    throw Error(StatusCode::INTERNAL, "get_action answered with the wrong number of ActionRows", "SERVER_FAILURE");
  AgentRows out;
  for (size_t g = 0; g < grouped.size(); ++g) {
    const auto& aids = grouped[g];
    const Space& space = space_of(aids[0], 1);
    const pb::Value& value = resp->get_action().actions(static_cast<int>(g)).actions();
    if (typed != nullptr) {
      std::vector<Action> acts = decode_actions(space, value, aids.size(), "actions from the server");
      for (size_t i = 0; i < aids.size(); ++i) (*typed)[aids[i]] = std::move(acts[i]);
      continue;
    }
    Floats acts = decode_value(space, value, aids.size(), "actions from the server");
    for (size_t i = 0; i < aids.size(); ++i)
      out[aids[i]] = Floats(acts.begin() + i * space.size(), acts.begin() + (i + 1) * space.size());
  }
  return out;
}

void MultiAgentPolicyClient::log_action(const std::string& episode_id, const AgentRows& observations,
                                        const AgentRows& actions) {
  pb::StreamRequest req;
  auto* msg = req.mutable_log_action();
  for (const auto& aids : groups(keys(observations))) {
    auto* rows = msg->add_rows();
    rows->add_episode_ids(episode_id);
    for (const auto& aid : aids) rows->add_agent_ids(aid);
    Floats obs = stack(aids, observations), acts = stack(aids, actions);
    check_rows(space_of(aids[0], 0), obs.size(), aids.size(), "observations");
    check_rows(space_of(aids[0], 1), acts.size(), aids.size(), "actions");
    fill_value(rows->mutable_observations(), space_of(aids[0], 0), obs.data(), aids.size(), "observations");
    fill_value(msg->add_actions(), space_of(aids[0], 1), acts.data(), aids.size(), "actions");
  }
  rows_->call(std::move(req), false);
}

void MultiAgentPolicyClient::log_returns(const std::string& episode_id, const std::map<std::string, double>& rewards,
                                         const std::map<std::string, bool>& terminated,
                                         const std::map<std::string, bool>& truncated,
                                         const AgentRows& final_observations) {
  std::vector<std::string> aids;
  auto add = [&](const std::string& aid) {
    if (std::find(aids.begin(), aids.end(), aid) == aids.end()) aids.push_back(aid);
  };
  for (const auto& kv : rewards) add(kv.first);
  for (const auto& kv : terminated) add(kv.first);
  for (const auto& kv : truncated) add(kv.first);
  if (aids.empty()) return;
  auto flag = [](const std::map<std::string, bool>& m, const std::string& aid) {
    auto it = m.find(aid);
    return it != m.end() && it->second;
  };
  // Agents with a final observation travel in rows of one space each; the rest together.
  std::vector<std::string> with_final, plain;
  for (const auto& aid : aids)
    (final_observations.count(aid) && aid != "__all__" ? with_final : plain).push_back(aid);
  std::vector<std::pair<std::vector<std::string>, bool>> batches;
  for (auto& g : groups(with_final)) batches.emplace_back(std::move(g), true);
  if (!plain.empty()) batches.emplace_back(plain, false);
  for (const auto& [group, has_final] : batches) {
    pb::RewardRows rows;
    rows.add_episode_ids(episode_id);
    Floats values;
    for (const auto& aid : group) {
      rows.add_agent_ids(aid);
      auto it = rewards.find(aid);
      values.push_back(it == rewards.end() ? 0.0f : static_cast<float>(it->second));
    }
    fill_float_tensor(rows.mutable_rewards(), values, {static_cast<int64_t>(group.size())});
    if (!terminated.empty() || !truncated.empty()) {
      for (const auto& aid : group) {
        rows.add_terminated(flag(terminated, aid));
        rows.add_truncated(flag(truncated, aid));
      }
    }
    if (has_final) {
      const Space& space = space_of(group[0], 0);
      Floats obs = stack(group, final_observations);
      check_rows(space, obs.size(), group.size(), "final_observations");
      fill_value(rows.mutable_final_observations(), space, obs.data(), group.size(), "final_observations");
    }
    rows_->queue_rewards(std::move(rows));
  }
}

void MultiAgentPolicyClient::end_episode(const std::string& episode_id, const AgentRows& final_observations,
                                         bool truncated, bool stopping) {
  pb::StreamRequest req;
  auto* msg = req.mutable_end_episode();
  msg->add_episode_ids(episode_id);
  msg->add_truncated(truncated);
  msg->set_stopping(stopping);
  for (const auto& aids : groups(keys(final_observations))) {
    auto* rows = msg->add_final_observations();
    rows->add_episode_ids(episode_id);
    for (const auto& aid : aids) rows->add_agent_ids(aid);
    const Space& space = space_of(aids[0], 0);
    Floats obs = stack(aids, final_observations);
    check_rows(space, obs.size(), aids.size(), "final_observations");
    fill_value(rows->mutable_observations(), space, obs.data(), aids.size(), "final_observations");
  }
  rows_->call(std::move(req), false);
}

void MultiAgentPolicyClient::flush() { rows_->flush(); }
void MultiAgentPolicyClient::close() { rows_->close(); }
std::string MultiAgentPolicyClient::session_id() const { return rows_->connection().session_id(); }

}  // namespace simbridge
