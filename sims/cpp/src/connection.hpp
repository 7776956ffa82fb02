// The connection engine of every C++ client (internal): a ready channel, one bidirectional Stream
// with a session, numbered requests, reconnect and resend. Mirrors simbridge/client/connection.py.
//
// Retry policy: a broken stream (UNAVAILABLE, CANCELLED, UNKNOWN, DEADLINE_EXCEEDED, or ended with
// no status) may have lost requests or their answers: reconnect with backoff, resume the session
// (CreateSession.resume_session_id) and resend every unanswered request under its seq; the server
// answers a seq it already applied from memory, so each request is applied exactly once. Any other
// status is the server's answer to the request: raised, never resent.
//
// Several bridge hosts (hosts.hpp): given several addresses, the client connects to one. When the
// server it is on goes away (nothing listens at its port any more, or its reconnect attempts fail
// for kFailoverAfterS), it moves to the next address that answers and opens a NEW session there
// with the same CreateSessionRequest, then raises SessionLost, as when a restarted server no longer
// knows the session. A request whose answer never came is NOT resent to the new server (its seq
// belonged to the old session, which applied it or not, and counted it or not, alone): it is dropped
// with the old session's episodes, so nothing is reported twice. Mirrors connection.py's _move.
//
// Transport: the address says it. HOST:PORT and unix:PATH carry the session on a gRPC stream;
// shm+unix:PATH opens it on a gRPC stream over unix:PATH and hands its requests and answers to the
// shared-memory channel (shm_channel.hpp), which breaks, resumes and resends as a stream does.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "credentials.hpp"
#include "log.hpp"
#include "simbridge/v1/simbridge.grpc.pb.h"
#include "step_stream.hpp"
#include "wire.hpp"

namespace simbridge {

bool retryable(StatusCode code);
// The request's header, whichever call it carries (nullptr for create_session).
pb::RequestHeader* header_of(pb::StreamRequest* req);
const char* kind_of(const pb::StreamRequest& req);

enum class Service { Single, Multi };

class Connection {
 public:
  // Called with a request that failed (it had no effect) before its error is raised: the policy
  // client resends the rewards it carried on their own.
  using OnFailed = std::function<void(const pb::StreamRequest&)>;
  // Called when the session is lost (a restarted server, or a move to another one); returns how
  // many open episodes ended with it (for the messages).
  using OnSessionLost = std::function<int()>;

  // addresses: parse_addresses' list (one or several).
  Connection(std::vector<std::string> addresses, Service service, pb::CreateSessionRequest create,
             const ClientOptions& options, bool pipeline, OnFailed on_failed = {}, OnSessionLost on_session_lost = {});
  ~Connection();

  // Send one request (its header's seq is set here). wait: read until its answer and return it;
  // otherwise (pipelined) return nullopt and let a later call read the answer and raise its error.
  std::optional<pb::StreamResponse> call(pb::StreamRequest req, bool wait);
  void flush();
  void close();

  pb::ExternalEnv::Stub& unary_stub() { return *single_; }
  // Every call's context carries the client's token (if any): the unary calls' too.
  void authorize(grpc::ClientContext& ctx) const { creds_.authorize(ctx); }
  std::string session_id() const { return session_id_; }
  const pb::ServerLimits& limits() const { return session_.limits(); }
  int reconnects() const { return reconnects_; }
  int moves() const { return moves_; }
  const std::string& address() const { return address_; }  // the one it is connected to

 private:
  pb::CreateSessionResponse open_session(const std::string& resume);
  void reconnect(const std::string& cause);
  void use(const std::string& address, std::shared_ptr<grpc::Channel> channel);
  [[noreturn]] void move(const std::string& why);
  pb::StreamResponse read_until(uint64_t seq);
  grpc::Status end_stream(bool cancel);
  [[noreturn]] void raise_failed(const Error& err, const pb::StreamRequest& req);
  void raise_deferred();

  struct Sent {
    uint64_t seq;
    pb::StreamRequest req;
  };
  std::vector<std::string> addresses_;
  std::string address_;
  std::string handover_;  // shm+unix:PATH: the handover socket PATH.shm; empty for other addresses
  Service service_;
  pb::CreateSessionRequest create_;
  Credentials creds_;
  LogCallback log_;
  double reconnect_timeout_s_;
  bool pipeline_;
  OnFailed on_failed_;
  OnSessionLost on_session_lost_;
  std::recursive_mutex mu_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::ExternalEnv::Stub> single_;
  std::unique_ptr<pb::ExternalMultiAgentEnv::Stub> multi_;
  std::unique_ptr<StepStream> stream_;  // null while none is open
  std::deque<Sent> outstanding_;
  std::optional<Error> deferred_;
  uint64_t seq_ = 0;
  bool closing_ = false, closed_ = false, broken_ = false;
  pb::CreateSessionResponse session_;
  std::string session_id_;
  int reconnects_ = 0, moves_ = 0;
};

}  // namespace simbridge
