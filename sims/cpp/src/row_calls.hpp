// What the two policy clients share (internal): their connection and the queue of rewards that
// rides along with the next call, and the episodes open in the session, as
// simbridge/client/row_calls.py's RowCalls does: when the session is lost (a restarted server, a
// move to another host) its open episodes ended with it, and a later call naming one is refused
// here with FAILED_PRECONDITION / EPISODE_ENDED, saying so.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "connection.hpp"

namespace simbridge {

class RowCalls {
 public:
  RowCalls(const std::vector<std::string>& addresses, Service service, pb::CreateSessionRequest create,
           const ClientOptions& options);

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
  int episodes_cut();  // the session was lost: its open episodes and queued rewards went with it
  void check_open(const google::protobuf::RepeatedPtrField<std::string>& episode_ids) const;
  std::unique_ptr<Connection> conn_;
  std::vector<pb::RewardRows> rewards_;
  std::set<std::string> open_;  // episode ids started and not ended
  std::set<std::string> cut_;   // episode ids that ended with a lost session
};

pb::CreateSessionRequest create_request(const ClientOptions& options, const Space& observation_space,
                                        const Space& action_space);

}  // namespace simbridge
