// The shared-memory step channel, the simulator's end (see shm_channel.hpp).
#include "shm_channel.hpp"

#include "wire.hpp"

#ifdef __linux__
#include <cerrno>
#include <cstring>
#include <deque>

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "shm_ring.hpp"
#endif

namespace simbridge {

namespace {
const std::string kShm = "shm+unix:";
const std::string kUnix = "unix:";
constexpr size_t kMaxSocketPath = 107;  // Linux's sun_path holds 108 bytes with the terminating NUL
const std::string kSuffix = ".shm";     // the handover socket beside the gRPC one
}  // namespace

ShmAddress split_shm_address(const std::string& address) {
  if (address.compare(0, kShm.size(), kShm) != 0) return {address, ""};
#ifndef __linux__
  throw Error(StatusCode::INVALID_ARGUMENT,
              "address '" + address + "': the shared-memory step channel (shm+unix:) is built for Linux only: "
              "use unix:" + address.substr(kShm.size()) + " (the same server, gRPC on its Unix socket)",
              "INVALID_REQUEST");
#else
  std::string target = address.substr(kShm.size() - kUnix.size());  // "unix:PATH"
  std::string path = target.substr(kUnix.size());
  if (path.compare(0, 2, "//") == 0) path = path.substr(2);  // the URI form: unix://<empty authority>/abs/path
  if (path.empty())
    throw Error(StatusCode::INVALID_ARGUMENT,
                "address '" + address + "' names no socket file: pass shm+unix:PATH, e.g. "
                "shm+unix:/tmp/simbridge/bridge.sock", "INVALID_REQUEST");
  const size_t longest = kMaxSocketPath - kSuffix.size();
  if (path.size() > longest)
    throw Error(StatusCode::INVALID_ARGUMENT,
                "address '" + address + "': the socket path is " + std::to_string(path.size()) +
                    " bytes, longer than the " + std::to_string(longest) + " a Unix socket allows (" +
                    std::to_string(kMaxSocketPath) + " less " + std::to_string(kSuffix.size()) +
                    " for the handover socket PATH" + kSuffix + "): pick a shorter path, e.g. "
                    "shm+unix:/tmp/simbridge/bridge.sock", "INVALID_REQUEST");
  return {target, path + kSuffix};
#endif
}

#ifndef __linux__

std::unique_ptr<StepStream> open_shm(const std::string&, std::unique_ptr<StepStream> grpc_stream,
                                     ::simbridge::v1::CreateSessionResponse*, double) {
  grpc_stream->close(true);
  throw Error(StatusCode::INVALID_ARGUMENT, "the shared-memory step channel is built for Linux only",
              "INVALID_REQUEST");
}

#else

namespace {

// An fd closed when it goes out of scope, unless released.
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    reset(o.release());
    return *this;
  }
  ~Fd() { reset(-1); }
  int release() {
    int f = fd;
    fd = -1;
    return f;
  }
  void reset(int f) {
    if (fd >= 0) ::close(fd);
    fd = f;
  }
};

// A failure of the channel's own machinery (a socket call, the region): the Connection retries it.
struct Unreachable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

class ShmStepStream : public StepStream {
 public:
  ShmStepStream(std::unique_ptr<StepStream> grpc_stream, Fd sock, Fd efd_requests, Fd efd_answers,
                std::unique_ptr<shm::Region> region)
      : grpc_(std::move(grpc_stream)), sock_(std::move(sock)), efd_requests_(std::move(efd_requests)),
        efd_answers_(std::move(efd_answers)), region_(std::move(region)) {}
  ~ShmStepStream() override { close(true); }

  bool write(const pb::StreamRequest& req) override {
    if (!ok()) return false;
    req.SerializeToString(&buf_);
    try {
      region_->outgoing().put(buf_, [this] { drain(); });
      return true;
    } catch (const shm::TooBig& e) {  // the Connection's size check keeps this from happening
      fail(grpc::StatusCode::RESOURCE_EXHAUSTED, e.what());
    } catch (const shm::PeerGone& e) {
      fail(grpc::StatusCode::UNAVAILABLE, std::string("the shared-memory channel broke: ") + e.what());
    }
    return false;
  }

  bool read(pb::StreamResponse* resp) override {
    if (!answers_.empty()) {
      buf_ = std::move(answers_.front());
      answers_.pop_front();
    } else {
      if (!ok()) return false;
      try {
        region_->incoming().get(&buf_);
      } catch (const shm::PeerGone& e) {
        fail(grpc::StatusCode::UNAVAILABLE, std::string("the shared-memory channel broke: ") + e.what());
        return false;
      }
    }
    if (resp->ParseFromString(buf_)) return true;
    fail(grpc::StatusCode::INTERNAL, "an answer on the shared-memory channel is not a StreamResponse");
    return false;
  }

  // Cancelling or not, the channel ends at once: the bridge has nothing of ours to finish.
  grpc::Status close(bool) override {
    if (region_) {
      region_.reset();
      sock_.reset(-1);  // the bridge's channel thread sees the hangup at once
      efd_requests_.reset(-1);
      efd_answers_.reset(-1);
      grpc_->close(true);  // the session's idle stream goes with its channel (as the Python client)
    }
    return failure_;  // OK unless the channel failed
  }

 private:
  bool ok() const { return region_ && failure_.ok(); }
  void fail(grpc::StatusCode code, const std::string& message) { failure_ = grpc::Status(code, message); }
  // While the request ring is full: take the answers waiting, so the bridge can go on.
  void drain() {
    auto& in = region_->incoming();
    std::string data;
    while (in.ready() && in.get(&data, 0)) answers_.push_back(std::move(data));
  }

  std::unique_ptr<StepStream> grpc_;
  Fd sock_, efd_requests_, efd_answers_;
  std::unique_ptr<shm::Region> region_;
  std::deque<std::string> answers_;  // taken by drain(), not yet read
  std::string buf_;
  grpc::Status failure_;
};

// Connect to the handover socket, say hello, and receive the answer and its fds.
Fd handover(const std::string& path, const std::string& session_id, double timeout_s, shm::Answer* answer,
            std::vector<Fd>* fds) {
  Fd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (sock.fd < 0) throw Unreachable(errno_text("socket"));
  timeval tv{static_cast<time_t>(timeout_s), static_cast<suseconds_t>((timeout_s - static_cast<time_t>(timeout_s)) * 1e6)};
  ::setsockopt(sock.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(sock.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());  // split_shm_address checked its length
  if (::connect(sock.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const int err = errno;
    std::string why = errno_text("connect");
    if (err == ENOENT || err == ECONNREFUSED) {  // a bridge on unix:PATH alone, or none
      const std::string grpc_path = path.substr(0, path.size() - kSuffix.size());
      why += ": no bridge hands over shared memory there: serve with --address shm+unix:" + grpc_path +
             " (a bridge on unix:" + grpc_path + " alone has no " + path + "), or dial unix:" + grpc_path;
    }
    throw Unreachable(why);
  }
  const std::string hi = shm::hello(session_id);
  if (::send(sock.fd, hi.data(), hi.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(hi.size()))
    throw Unreachable(errno_text("send"));
  char data[4096];
  alignas(cmsghdr) char control[CMSG_SPACE(3 * sizeof(int))];
  iovec iov{data, sizeof data};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t got = ::recvmsg(sock.fd, &msg, MSG_CMSG_CLOEXEC);
  if (got < 0) throw Unreachable(errno_text("no answer"));
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      fds->emplace_back(fd);
    }
  }
  if (got == 0) throw Unreachable("the server closed the handover socket without an answer");
  try {
    *answer = shm::parse_answer(std::string(data, static_cast<size_t>(got)));
  } catch (const std::invalid_argument& e) {
    throw Unreachable(e.what());
  }
  timeval none{0, 0};  // from here the socket only tells of a peer gone, by poll()
  ::setsockopt(sock.fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
  ::setsockopt(sock.fd, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none);
  return sock;
}

Error refusal(const shm::Answer& a) {
  auto code = a.code <= 16 ? static_cast<StatusCode>(a.code) : StatusCode::UNKNOWN;
  std::string reason = a.reason != 0 && pb::ErrorReason_IsValid(static_cast<int>(a.reason))
                           ? pb::ErrorReason_Name(static_cast<pb::ErrorReason>(a.reason))
                           : default_reason(code);
  return Error(code, a.message, reason);
}

}  // namespace

std::unique_ptr<StepStream> open_shm(const std::string& handover_path, std::unique_ptr<StepStream> grpc_stream,
                                     pb::CreateSessionResponse* session, double timeout_s) {
  try {
    shm::Answer answer;
    std::vector<Fd> fds;
    Fd sock = handover(handover_path, session->session_id(), timeout_s, &answer, &fds);
    if (answer.code != 0) throw refusal(answer);
    if (fds.size() != 3) throw Unreachable("the shared-memory handover passed no region");
    std::unique_ptr<shm::Region> region;
    try {
      region = std::make_unique<shm::Region>(fds[0].fd, answer.capacity, fds[1].fd, fds[2].fd, sock.fd,
                                             /*server=*/false, shm::client_spin_s());
    } catch (const std::invalid_argument& e) {
      throw Unreachable(e.what());
    }
    fds[0].reset(-1);  // mapped: the memfd is no longer needed
    const int64_t limit = static_cast<int64_t>(answer.capacity) - 4;
    auto* limits = session->mutable_limits();
    if (limits->max_message_bytes() <= 0 || limits->max_message_bytes() > limit) limits->set_max_message_bytes(limit);
    return std::make_unique<ShmStepStream>(std::move(grpc_stream), std::move(sock), std::move(fds[1]),
                                           std::move(fds[2]), std::move(region));
  } catch (const Unreachable& e) {
    if (grpc_stream) grpc_stream->close(true);
    throw Error(StatusCode::UNAVAILABLE,
                "could not open the shared-memory channel at " + handover_path + ": " + e.what(), "SERVER_UNAVAILABLE");
  } catch (...) {
    if (grpc_stream) grpc_stream->close(true);
    throw;
  }
}

#endif

}  // namespace simbridge
