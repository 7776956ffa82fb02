// What the two policy clients share (internal): their connection and the queue of rewards that
// rides along with the next call, as simbridge/client/row_calls.py's RowCalls does.
#pragma once

#include <memory>
#include <vector>

#include "connection.hpp"

namespace simbridge {

class RowCalls {
 public:
  RowCalls(const std::string& address, Service service, pb::CreateSessionRequest create, const ClientOptions& options);

  // Rows with done flags go out at once (pipelined LogReturns); plain rewards wait for the next
  // get_action/log_action/end_episode, which carries them (applied first, all or nothing).
  void queue_rewards(pb::RewardRows rows);
  void send_rewards();
  // wait: return the answer; otherwise pipelined (nullopt).
  std::optional<pb::StreamResponse> call(pb::StreamRequest req, bool wait);
  std::string start_episode(bool training_enabled);
  void flush();
  void close();
  Connection& connection() const { return *conn_; }

 private:
  void resend_rewards(const pb::StreamRequest& failed);
  std::unique_ptr<Connection> conn_;
  std::vector<pb::RewardRows> rewards_;
};

pb::CreateSessionRequest create_request(const ClientOptions& options, const Space& observation_space,
                                        const Space& action_space);

}  // namespace simbridge
