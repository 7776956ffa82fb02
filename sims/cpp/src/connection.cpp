// The connection engine (see connection.hpp).
#include "connection.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

#include "backoff.hpp"
#include "hosts.hpp"
#include "shm_channel.hpp"

namespace simbridge {

namespace {
constexpr size_t kFramingBytes = 1024;  // request header + stream envelope, generously

// The session's requests on a gRPC bidirectional Stream (TCP or a Unix socket).
class GrpcStepStream : public StepStream {
 public:
  GrpcStepStream(Service service, pb::ExternalEnv::Stub& single, pb::ExternalMultiAgentEnv::Stub& multi,
                 const Credentials& creds) {
    creds.authorize(ctx_);
    stream_ = service == Service::Single ? single.Stream(&ctx_) : multi.Stream(&ctx_);
  }
  ~GrpcStepStream() override { close(true); }
  bool write(const pb::StreamRequest& req) override { return stream_->Write(req); }
  bool read(pb::StreamResponse* resp) override { return stream_->Read(resp); }
  grpc::Status close(bool cancel) override {
    if (finished_) return status_;
    if (cancel) ctx_.TryCancel();
    else stream_->WritesDone();
    pb::StreamResponse ignored;
    while (stream_->Read(&ignored)) {
    }
    finished_ = true;
    status_ = stream_->Finish();
    return status_;
  }

 private:
  grpc::ClientContext ctx_;  // before stream_: it must outlive the call
  std::unique_ptr<grpc::ClientReaderWriter<pb::StreamRequest, pb::StreamResponse>> stream_;
  bool finished_ = false;
  grpc::Status status_;
};
}  // namespace

bool retryable(StatusCode code) {
  return code == StatusCode::UNAVAILABLE || code == StatusCode::CANCELLED || code == StatusCode::UNKNOWN ||
         code == StatusCode::DEADLINE_EXCEEDED;
}

pb::RequestHeader* header_of(pb::StreamRequest* req) {
  switch (req->payload_case()) {
    case pb::StreamRequest::kStartEpisode: return req->mutable_start_episode()->mutable_header();
    case pb::StreamRequest::kGetAction: return req->mutable_get_action()->mutable_header();
    case pb::StreamRequest::kLogAction: return req->mutable_log_action()->mutable_header();
    case pb::StreamRequest::kLogReturns: return req->mutable_log_returns()->mutable_header();
    case pb::StreamRequest::kEndEpisode: return req->mutable_end_episode()->mutable_header();
    case pb::StreamRequest::kCloseSession: return req->mutable_close_session()->mutable_header();
    case pb::StreamRequest::kStep: return req->mutable_step()->mutable_header();
    default: return nullptr;
  }
}

const char* kind_of(const pb::StreamRequest& req) {
  switch (req.payload_case()) {
    case pb::StreamRequest::kCreateSession: return "create_session";
    case pb::StreamRequest::kStartEpisode: return "start_episode";
    case pb::StreamRequest::kGetAction: return "get_action";
    case pb::StreamRequest::kLogAction: return "log_action";
    case pb::StreamRequest::kLogReturns: return "log_returns";
    case pb::StreamRequest::kEndEpisode: return "end_episode";
    case pb::StreamRequest::kCloseSession: return "close_session";
    case pb::StreamRequest::kStep: return "step";
    default: return "empty request";
  }
}

Connection::Connection(std::vector<std::string> addresses, Service service, pb::CreateSessionRequest create,
                       const ClientOptions& options, bool pipeline, OnFailed on_failed, OnSessionLost on_session_lost)
    : addresses_(parse_addresses(addresses)), service_(service), create_(std::move(create)), creds_(options), log_(options.log),
      reconnect_timeout_s_(options.reconnect_timeout_s), pipeline_(pipeline), on_failed_(std::move(on_failed)),
      on_session_lost_(std::move(on_session_lost)) {
  // The channel's arguments, gRPC's per-attempt connect deadline among them: hosts.cpp's new_channel.
  auto [address, channel] = connect_any(try_order(addresses_, start_index(addresses_.size()), monotonic_s()),
                                        creds_, options.connect_timeout_s, log_);
  use(address, std::move(channel));
  session_ = open_session("");
  session_id_ = session_.session_id();
}

void Connection::use(const std::string& address, std::shared_ptr<grpc::Channel> channel) {
  address_ = address;
  handover_ = split_shm_address(address).handover;
  channel_ = std::move(channel);
  single_ = pb::ExternalEnv::NewStub(channel_);
  multi_ = pb::ExternalMultiAgentEnv::NewStub(channel_);
}

Connection::~Connection() {
  try {
    close();
  } catch (...) {
  }
}

// ---------------------------------------------------------------- session

grpc::Status Connection::end_stream(bool cancel) {
  if (!stream_) return grpc::Status::OK;
  grpc::Status status = stream_->close(cancel);
  stream_.reset();
  return status;
}

pb::CreateSessionResponse Connection::open_session(const std::string& resume) {
  pb::StreamRequest req;
  *req.mutable_create_session() = create_;
  if (!resume.empty()) req.mutable_create_session()->set_resume_session_id(resume);
  stream_ = std::make_unique<GrpcStepStream>(service_, *single_, *multi_, creds_);
  pb::StreamResponse resp;
  if (!stream_->write(req) || !stream_->read(&resp)) {
    grpc::Status st = end_stream(false);
    if (st.ok()) throw Error(StatusCode::UNAVAILABLE, "the stream ended before create_session was answered");
    throw error_from_grpc(st);
  }
  if (resp.has_error()) throw error_from_status(resp.error());
  // shm+unix: the session's calls go through shared memory from here on (its limit capped to the ring's).
  if (!handover_.empty()) stream_ = open_shm(handover_, std::move(stream_), resp.mutable_create_session());
  return resp.create_session();
}

void Connection::reconnect(const std::string& cause) {
  if (closing_)
    throw Error(StatusCode::UNAVAILABLE, "connection to " + address_ + " lost while closing", "SERVER_UNAVAILABLE");
  const bool others = addresses_.size() > 1;
  // Between attempts, watch the channel rather than sleep blind: gRPC notices a finished connect
  // only while someone polls the channel (else at its backup poll, every 5 s), so a server back
  // on its address is seen at once and the next attempt goes then.
  Backoff backoff(others ? std::min(reconnect_timeout_s_, kFailoverAfterS) : reconnect_timeout_s_, 0.05, 1.0,
                  monotonic_s, [this](double s) {
    const auto until = std::chrono::system_clock::now() + std::chrono::microseconds(static_cast<int64_t>(s * 1e6));
    if (channel_->GetState(true) != GRPC_CHANNEL_READY && channel_->WaitForConnected(until)) return;
    std::this_thread::sleep_until(until);  // connected already (the session failed otherwise): wait the delay
  });
  emit(log_, LogLevel::Warning, "connection to " + address_ + " broke (" + cause + "); reconnecting");
  pb::CreateSessionResponse resp;
  while (true) {
    end_stream(true);
    try {
      resp = open_session(session_id_);
      break;
    } catch (const Error& e) {
      // A refusal (a token no longer accepted, a session owned by another credential) keeps its
      // code and reason: retrying would not change it, and the caller branches on the reason.
      if (!retryable(e.code()))
        throw Error(e.code(), "reconnecting to " + address_ + ", the server refused to resume session " + session_id_ + ": " + e.what(),
                    e.reason());
      if (others) {
        // A closed port has lost the session for good (a restarted server would not know it
        // either): move at once; anything else gets kFailoverAfterS to come back.
        Probe p = probe(split_shm_address(address_).grpc_target, creds_.tls());
        if (!p.closed && backoff.wait()) continue;
        move(p.what);
      }
      if (!backoff.wait())
        throw Error(StatusCode::UNAVAILABLE,
                    "lost the simbridge server at " + address_ + " and could not reconnect within " +
                        fmt_s(reconnect_timeout_s_) + ": " + e.what(),
                    "SERVER_UNAVAILABLE");
    }
  }
  ++reconnects_;
  if (!resp.resumed()) {
    std::string old = session_id_;
    session_ = resp;
    session_id_ = resp.session_id();
    outstanding_.clear();
    seq_ = 0;
    const int ended = on_session_lost_ ? on_session_lost_() : 0;
    emit(log_, LogLevel::Warning, "the server at " + address_ + " no longer had session " + old + " (restarted or expired); " +
         "new session " + session_id_ + ", " + std::to_string(ended) + " open episode(s) ended");
    throw SessionLost(StatusCode::UNAVAILABLE,
                      "the server no longer had session " + old + " (restarted or expired): its open episodes "
                      "are gone; start new episodes (new session " + session_id_ + ")",
                      "SESSION_UNKNOWN");
  }
  emit(log_, LogLevel::Info,
       "resumed session " + session_id_ + "; resending " + std::to_string(outstanding_.size()) + " requests");
  for (const auto& sent : outstanding_) stream_->write(sent.req);  // a failure shows at the next read
}

void Connection::move(const std::string& why) {
  const std::string old = address_, old_session = session_id_;
  mark_down(old, monotonic_s());
  auto at = std::find(addresses_.begin(), addresses_.end(), old) - addresses_.begin();
  std::vector<std::string> order;  // the lost one last: it may come back
  for (size_t k = 1; k <= addresses_.size(); ++k) order.push_back(addresses_[(at + k) % addresses_.size()]);
  try {
    auto [address, channel] = connect_any(order, creds_, reconnect_timeout_s_, log_);
    use(address, std::move(channel));
    outstanding_.clear();  // dropped, not resent: the old session applied them or not, alone
    seq_ = 0;
    session_ = open_session("");
  } catch (const Error& e) {
    throw Error(StatusCode::UNAVAILABLE,
                "lost the simbridge trainer at " + old + " (" + why + ") and found no other: " + e.what(),
                "SERVER_UNAVAILABLE");
  }
  session_id_ = session_.session_id();
  ++reconnects_;
  ++moves_;
  const int ended = on_session_lost_ ? on_session_lost_() : 0;
  emit(log_, LogLevel::Warning, "bridge at " + old + " went away (" + why + "); moved to " + address_ + " (new session " +
       session_id_ + ", " + std::to_string(ended) + " open episode(s) ended)");
  throw SessionLost(StatusCode::UNAVAILABLE,
                    "the bridge at " + old + " went away (" + why + "); moved to " + address_ + " (new session " +
                        session_id_ + "); the " + std::to_string(ended) + " open episode(s) of session " + old_session +
                        " ended with the old one: start new episodes",
                    "SESSION_UNKNOWN");
}

// ---------------------------------------------------------------- calls

std::optional<pb::StreamResponse> Connection::call(pb::StreamRequest req, bool wait) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (closed_) throw Error(StatusCode::FAILED_PRECONDITION, "the client is closed", "WRONG_SESSION_KIND");
  int64_t limit = session_.limits().max_message_bytes();
  // Refused here (with room for header and framing): the server would end the stream.
  if (limit > 0 && req.ByteSizeLong() + kFramingBytes > static_cast<size_t>(limit)) {
    if (on_failed_) on_failed_(req);
    throw Error(StatusCode::RESOURCE_EXHAUSTED,
                std::string(kind_of(req)) + " request of " + std::to_string(req.ByteSizeLong()) +
                    " bytes exceeds the server's limit of " + std::to_string(limit) + " bytes: send fewer rows per call",
                "MESSAGE_TOO_LARGE");
  }
  if (broken_) {
    broken_ = false;
    reconnect("the previous stream ended with an error");
  }
  header_of(&req)->set_seq(++seq_);
  outstanding_.push_back({seq_, std::move(req)});
  if (stream_) stream_->write(outstanding_.back().req);  // a failure shows at the next read
  if (wait || !pipeline_) return read_until(seq_);
  return std::nullopt;
}

void Connection::flush() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (!outstanding_.empty()) read_until(outstanding_.back().seq);
  raise_deferred();
}

void Connection::raise_failed(const Error& err, const pb::StreamRequest& req) {
  // on_failed has its say first; an error of its own is raised instead.
  if (on_failed_) on_failed_(req);
  throw err;
}

void Connection::raise_deferred() {
  if (deferred_) {
    Error err = *deferred_;
    deferred_.reset();
    throw err;
  }
}

pb::StreamResponse Connection::read_until(uint64_t seq) {
  while (true) {
    pb::StreamResponse resp;
    if (!stream_ || !stream_->read(&resp)) {
      grpc::Status st = end_stream(false);
      if (!st.ok() && !retryable(from_grpc(st.error_code())) && !outstanding_.empty()) {
        // The server ended the stream on purpose: resending would fail again. Say why; the next
        // call reconnects and resends what is still unanswered.
        broken_ = true;
        Sent bad = std::move(outstanding_.front());
        outstanding_.pop_front();
        raise_failed(error_from_grpc(st, std::string(kind_of(bad.req)) + " failed and ended the stream: "), bad.req);
      }
      reconnect(st.ok() ? "the stream ended" : st.error_message());
      continue;
    }
    if (outstanding_.empty())
      throw Error(StatusCode::INTERNAL, "the server answered a request that was never sent", "SERVER_FAILURE");
    Sent got = std::move(outstanding_.front());
    outstanding_.pop_front();
    if (resp.has_error()) {
      Error err = error_from_status(resp.error());
      if (on_failed_) on_failed_(got.req);
      if (got.seq == seq) {
        raise_deferred();
        throw err;
      }
      if (!deferred_)
        deferred_ = Error(err.code(), std::string("an earlier ") + kind_of(got.req) + " failed: " + err.what(), err.reason());
      continue;
    }
    if (got.seq == seq) {
      raise_deferred();
      return resp;
    }
  }
}

void Connection::close() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (closed_) return;
  closing_ = true;  // a dead server is not worth reconnecting to now
  try {
    flush();
    pb::StreamRequest req;
    req.mutable_close_session();
    call(std::move(req), true);
  } catch (const Error&) {
  }
  closed_ = true;
  end_stream(false);
}

}  // namespace simbridge
