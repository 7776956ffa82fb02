// SlotClient: a batched simulator's client (N slots, one Step per step, per-slot auto-reset), as
// simbridge/client/slot_client.py. Steps wait for their answers: nothing to pipeline.
#include "connection.hpp"
#include "hosts.hpp"
#include "row_calls.hpp"

namespace simbridge {

namespace {

// The outcome of the previous actions into a StepRequest, checked against the slot count.
void fill_outcome(pb::StepRequest* req, const Space& obs_space, size_t n, const Floats& rewards,
                  const std::vector<bool>& terminated, const std::vector<bool>& truncated,
                  const Floats& final_observations, bool final_step) {
  auto check = [n](size_t got, const char* what) {
    if (got != 0 && got != n)
      throw invalid_request(std::string(what) + ": one per slot (" + std::to_string(n) + "), got " + std::to_string(got));
  };
  check(rewards.size(), "rewards");
  check(terminated.size(), "terminated");
  check(truncated.size(), "truncated");
  if (!rewards.empty()) fill_float_tensor(req->mutable_rewards(), rewards, {static_cast<int64_t>(n)});
  if (!terminated.empty()) fill_bool_tensor(req->mutable_terminated(), terminated);
  if (!truncated.empty()) fill_bool_tensor(req->mutable_truncated(), truncated);
  size_t ended = n;  // the final step ends every slot's episode
  if (!final_step) {
    ended = 0;
    for (size_t i = 0; i < n; ++i)
      ended += ((!terminated.empty() && terminated[i]) || (!truncated.empty() && truncated[i])) ? 1 : 0;
  }
  if (final_observations.empty()) return;
  check_rows(obs_space, final_observations.size(), ended, "final_observations (one row per ended slot)");
  if (ended > 0) fill_value(req->mutable_final_observations(), obs_space, final_observations.data(), ended,
                            "final_observations");
}

}  // namespace

SlotClient::SlotClient(const std::string& addresses, const Space& observation_space, const Space& action_space,
                       int num_slots, ClientOptions options)
    : SlotClient(parse_addresses(addresses), observation_space, action_space, num_slots, std::move(options)) {}

SlotClient::SlotClient(const std::vector<std::string>& addresses, const Space& observation_space,
                       const Space& action_space, int num_slots, ClientOptions options)
    : observation_space_(observation_space), action_space_(action_space), num_slots_(num_slots) {
  if (num_slots <= 0) throw invalid_request("num_slots must be positive");
  pb::CreateSessionRequest create = create_request(options, observation_space, action_space);
  create.set_num_slots(num_slots);
  if (!options.slots_training_enabled) create.set_slots_training_enabled(false);
  // A lost session ended every slot's episode; the next step without an outcome starts new ones.
  conn_ = std::make_unique<Connection>(addresses, Service::Single, std::move(create), options, false,
                                       Connection::OnFailed{}, [num_slots] { return num_slots; });
}

SlotClient::~SlotClient() {
  try {
    close();
  } catch (...) {
  }
}

Floats SlotClient::step(const Floats& observations, const Floats& rewards, const std::vector<bool>& terminated,
                        const std::vector<bool>& truncated, const Floats& final_observations) {
  return request_step(observations, rewards, terminated, truncated, final_observations, nullptr);
}

std::vector<Action> SlotClient::act(const Floats& observations, const Floats& rewards,
                                    const std::vector<bool>& terminated, const std::vector<bool>& truncated,
                                    const Floats& final_observations) {
  std::vector<Action> typed;
  request_step(observations, rewards, terminated, truncated, final_observations, &typed);
  return typed;
}

Floats SlotClient::request_step(const Floats& observations, const Floats& rewards, const std::vector<bool>& terminated,
                                const std::vector<bool>& truncated, const Floats& final_observations,
                                std::vector<Action>* typed) {
  const size_t n = static_cast<size_t>(num_slots_);
  check_rows(observation_space_, observations.size(), n, "observations");
  pb::StreamRequest req;
  auto* msg = req.mutable_step();
  fill_value(msg->mutable_observations(), observation_space_, observations.data(), n, "observations");
  fill_outcome(msg, observation_space_, n, rewards, terminated, truncated, final_observations, false);
  auto resp = conn_->call(std::move(req), true);
  const auto& out = resp->step();
  policy_versions_ = out.has_policy_versions() ? tensor_ints(out.policy_versions(), "policy_versions")
                                               : std::vector<int64_t>{};
  policy_id_ = out.policy_id();
  if (typed != nullptr) {
    *typed = decode_actions(action_space_, out.actions(), n, "actions from the server");
    return {};
  }
  return decode_value(action_space_, out.actions(), n, "actions from the server");
}

void SlotClient::close(const Floats& rewards, const std::vector<bool>& terminated, const std::vector<bool>& truncated,
                       const Floats& last_observations) {
  try {
    pb::StreamRequest req;
    auto* msg = req.mutable_step();
    msg->set_final(true);
    fill_outcome(msg, observation_space_, static_cast<size_t>(num_slots_), rewards, terminated, truncated,
                 last_observations, true);
    conn_->call(std::move(req), true);
  } catch (...) {
    conn_->close();
    throw;
  }
  conn_->close();
}

void SlotClient::close() { conn_->close(); }
std::string SlotClient::session_id() const { return conn_->session_id(); }
int SlotClient::reconnects() const { return conn_->reconnects(); }

}  // namespace simbridge
