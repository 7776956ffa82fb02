// PolicyClient (ExternalEnv: one agent per episode) and the reward queue both policy clients share.
#include <google/protobuf/repeated_field.h>

#include "hosts.hpp"
#include "row_calls.hpp"

namespace simbridge {

pb::CreateSessionRequest create_request(const ClientOptions& options, const Space& observation_space,
                                        const Space& action_space) {
  pb::CreateSessionRequest create;
  create.set_client_name(options.client_name);
  space_to_proto(observation_space, create.mutable_observation_space());
  space_to_proto(action_space, create.mutable_action_space());
  return create;
}

// ---------------------------------------------------------------- RowCalls

RowCalls::RowCalls(const std::vector<std::string>& addresses, Service service, pb::CreateSessionRequest create,
                   const ClientOptions& options)
    : conn_(std::make_unique<Connection>(
          addresses, service, std::move(create), options, true,
          [this](const pb::StreamRequest& failed) { resend_rewards(failed); }, [this] { return episodes_cut(); })) {}

int RowCalls::episodes_cut() {
  cut_ = std::move(open_);
  open_.clear();
  rewards_.clear();
  return static_cast<int>(cut_.size());
}

void RowCalls::check_open(const google::protobuf::RepeatedPtrField<std::string>& episode_ids) const {
  for (const auto& eid : episode_ids)
    if (cut_.count(eid))
      throw Error(StatusCode::FAILED_PRECONDITION,
                  "episode '" + eid + "' already ended (with its session, lost: the client is on a new session at " +
                      conn_->address() + "): start a new episode",
                  "EPISODE_ENDED");
}

void RowCalls::queue_rewards(pb::RewardRows rows) {
  if (!cut_.empty()) check_open(rows.episode_ids());
  bool flagged = rows.terminated_size() > 0 || rows.truncated_size() > 0;
  rewards_.push_back(std::move(rows));
  if (flagged) send_rewards();
}

void RowCalls::send_rewards() {
  if (rewards_.empty()) return;
  pb::StreamRequest req;
  auto* msg = req.mutable_log_returns();
  for (auto& rows : rewards_) *msg->add_rows() = std::move(rows);
  rewards_.clear();
  conn_->call(std::move(req), false);
}

void RowCalls::resend_rewards(const pb::StreamRequest& failed) {
  // A failed request had no effect: the rewards it carried are logged on their own, so a bad
  // observation never costs a reward (if the rewards were the problem, this fails too and says so).
  const google::protobuf::RepeatedPtrField<pb::RewardRows>* carried = nullptr;
  if (failed.has_get_action()) carried = &failed.get_action().rewards();
  if (failed.has_log_action()) carried = &failed.log_action().rewards();
  if (failed.has_end_episode()) carried = &failed.end_episode().rewards();
  if (carried == nullptr || carried->empty()) return;
  pb::StreamRequest retry;
  *retry.mutable_log_returns()->mutable_rows() = *carried;
  conn_->call(std::move(retry), false);
}

std::optional<pb::StreamResponse> RowCalls::call(pb::StreamRequest req, bool wait) {
  if (!cut_.empty()) {
    if (req.has_end_episode()) check_open(req.end_episode().episode_ids());
    for (const auto& rows : req.has_get_action() ? req.get_action().rows() : req.log_action().rows())
      check_open(rows.episode_ids());
  }
  if (req.has_end_episode())
    for (const auto& eid : req.end_episode().episode_ids()) open_.erase(eid);
  google::protobuf::RepeatedPtrField<pb::RewardRows>* carry = nullptr;
  if (req.has_get_action()) carry = req.mutable_get_action()->mutable_rewards();
  if (req.has_log_action()) carry = req.mutable_log_action()->mutable_rewards();
  if (req.has_end_episode()) carry = req.mutable_end_episode()->mutable_rewards();
  if (carry != nullptr) {
    for (auto& rows : rewards_) *carry->Add() = std::move(rows);
    rewards_.clear();
  } else {
    send_rewards();
  }
  return conn_->call(std::move(req), wait);
}

std::string RowCalls::start_episode(bool training_enabled) {
  pb::StreamRequest req;
  req.mutable_start_episode()->set_count(1);
  req.mutable_start_episode()->set_training_enabled(training_enabled);
  auto resp = call(std::move(req), true);
  if (resp->start_episode().episode_ids_size() != 1)
    throw Error(StatusCode::INTERNAL, "start_episode answered without one episode id", "SERVER_FAILURE");
  open_.insert(resp->start_episode().episode_ids(0));
  return resp->start_episode().episode_ids(0);
}

void RowCalls::flush() {
  send_rewards();
  conn_->flush();
}

void RowCalls::close() {
  try {
    send_rewards();
  } catch (...) {
    conn_->close();
    throw;
  }
  conn_->close();
}

// ---------------------------------------------------------------- PolicyClient

PolicyClient::PolicyClient(const std::string& addresses, const Space& observation_space, const Space& action_space,
                           ClientOptions options)
    : PolicyClient(parse_addresses(addresses), observation_space, action_space, std::move(options)) {}

PolicyClient::PolicyClient(const std::vector<std::string>& addresses, const Space& observation_space,
                           const Space& action_space, ClientOptions options)
    : observation_space_(observation_space), action_space_(action_space),
      rows_(std::make_unique<RowCalls>(addresses, Service::Single,
                                       create_request(options, observation_space, action_space), options)) {}

PolicyClient::~PolicyClient() {
  try {
    close();
  } catch (...) {
  }
}

std::string PolicyClient::start_episode(bool training_enabled) { return rows_->start_episode(training_enabled); }

Floats PolicyClient::get_action(const std::string& episode_id, const Floats& observation) {
  return request_actions({episode_id}, observation, nullptr);
}

Action PolicyClient::act(const std::string& episode_id, const Floats& observation) {
  std::vector<Action> typed;
  request_actions({episode_id}, observation, &typed);
  return std::move(typed.front());
}

Floats PolicyClient::get_actions(const std::vector<std::string>& episode_ids, const Floats& observations) {
  return request_actions(episode_ids, observations, nullptr);
}

std::vector<Action> PolicyClient::act(const std::vector<std::string>& episode_ids, const Floats& observations) {
  std::vector<Action> typed;
  request_actions(episode_ids, observations, &typed);
  return typed;
}

Floats PolicyClient::request_actions(const std::vector<std::string>& episode_ids, const Floats& observations,
                                     std::vector<Action>* typed) {
  const size_t n = episode_ids.size();
  check_rows(observation_space_, observations.size(), n, "observations");
  pb::StreamRequest req;
  auto* rows = req.mutable_get_action()->add_rows();
  for (const auto& eid : episode_ids) rows->add_episode_ids(eid);
  fill_value(rows->mutable_observations(), observation_space_, observations.data(), n, "observations");
  auto resp = rows_->call(std::move(req), true);
  if (resp->get_action().actions_size() != 1)
    throw Error(StatusCode::INTERNAL, "get_action answered without one ActionRows", "SERVER_FAILURE");
  const auto& out = resp->get_action().actions(0);
  if (out.policy_versions_size() > 0) last_policy_version_ = out.policy_versions(out.policy_versions_size() - 1);
  if (typed != nullptr) {
    *typed = decode_actions(action_space_, out.actions(), n, "actions from the server");
    return {};
  }
  return decode_value(action_space_, out.actions(), n, "actions from the server");
}

void PolicyClient::log_action(const std::string& episode_id, const Floats& observation, const Floats& action) {
  check_rows(observation_space_, observation.size(), 1, "observation");
  check_rows(action_space_, action.size(), 1, "action");
  pb::StreamRequest req;
  auto* msg = req.mutable_log_action();
  auto* rows = msg->add_rows();
  rows->add_episode_ids(episode_id);
  fill_value(rows->mutable_observations(), observation_space_, observation.data(), 1, "observation");
  fill_value(msg->add_actions(), action_space_, action.data(), 1, "action");
  rows_->call(std::move(req), false);
}

void PolicyClient::log_action(const std::string& episode_id, const Floats& observation, const Action& action) {
  check_rows(observation_space_, observation.size(), 1, "observation");
  pb::StreamRequest req;
  auto* msg = req.mutable_log_action();
  auto* rows = msg->add_rows();
  rows->add_episode_ids(episode_id);
  fill_value(rows->mutable_observations(), observation_space_, observation.data(), 1, "observation");
  fill_actions(msg->add_actions(), action_space_, {&action}, "action");
  rows_->call(std::move(req), false);
}

void PolicyClient::log_returns(const std::string& episode_id, double reward) {
  pb::RewardRows rows;
  rows.add_episode_ids(episode_id);
  fill_float_tensor(rows.mutable_rewards(), {static_cast<float>(reward)}, {1});
  rows_->queue_rewards(std::move(rows));
}

void PolicyClient::end_episode(const std::string& episode_id, const Floats& final_observation, bool truncated,
                               bool stopping) {
  check_rows(observation_space_, final_observation.size(), 1, "final_observation");
  pb::StreamRequest req;
  auto* msg = req.mutable_end_episode();
  msg->add_episode_ids(episode_id);
  msg->add_truncated(truncated);
  msg->set_stopping(stopping);
  auto* rows = msg->add_final_observations();
  rows->add_episode_ids(episode_id);
  fill_value(rows->mutable_observations(), observation_space_, final_observation.data(), 1, "final_observation");
  rows_->call(std::move(req), false);
}

void PolicyClient::flush() { rows_->flush(); }
void PolicyClient::close() { rows_->close(); }
std::string PolicyClient::session_id() const { return rows_->connection().session_id(); }
int PolicyClient::reconnects() const { return rows_->connection().reconnects(); }

std::string PolicyClient::get_policy(int64_t known_version) {
  rows_->flush();
  pb::GetPolicyRequest req;
  req.mutable_header()->set_session_id(session_id());  // seq 0: nothing to deduplicate
  req.set_known_version(known_version);
  pb::GetPolicyResponse resp;
  grpc::ClientContext ctx;
  rows_->connection().authorize(ctx);
  grpc::Status st = rows_->connection().unary_stub().GetPolicy(&ctx, req, &resp);
  if (!st.ok()) throw error_from_grpc(st);
  return resp.unchanged() ? std::string() : resp.policy().SerializeAsString();
}

}  // namespace simbridge
