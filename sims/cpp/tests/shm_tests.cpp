// Unit tests of the shared-memory rings (src/shm_ring.hpp) without a server: both ends of one
// region in this process, over a memfd, two eventfds and a socketpair standing for the handover
// socket. The layout is pinned byte for byte (simbridge/wire/shm_ring.py reads the same bytes);
// messages wrap around the ring's end, a message that can never fit is refused, a full ring waits
// for room, and a peer that closes its socket ends a wait at once. open_shm against a stand-in
// bridge thread: the hello, the cap on the session's message size, requests pipelined far beyond
// a full ring answered in order, a hangup as a broken stream, a refusal's status and reason.
// Linux only.
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.hpp"
#include "shm_channel.hpp"
#include "shm_ring.hpp"
#include "wire.hpp"

using namespace simbridge;

namespace {

// A region as the bridge makes it, mapped by both ends.
struct Pair {
  int memfd, efd_req, efd_resp, socks[2];
  uint64_t capacity;
  std::unique_ptr<shm::Region> server, client;

  explicit Pair(uint64_t cap) : capacity(cap) {
    memfd = ::memfd_create("simbridge-shm-test", MFD_CLOEXEC);
    if (memfd < 0 || ::ftruncate(memfd, static_cast<off_t>(shm::region_bytes(cap))) != 0) throw std::runtime_error("memfd");
    efd_req = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    efd_resp = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, socks) != 0) throw std::runtime_error("socketpair");
    server = std::make_unique<shm::Region>(memfd, cap, efd_req, efd_resp, socks[0], true, 0.0, /*fresh=*/true);
    client = std::make_unique<shm::Region>(memfd, cap, efd_req, efd_resp, socks[1], false, 0.0);
  }
  ~Pair() {
    server.reset();
    client.reset();
    for (int fd : {memfd, efd_req, efd_resp, socks[0], socks[1]})
      if (fd >= 0) ::close(fd);
  }
  // The region's bytes as the other process sees them.
  std::vector<uint8_t> bytes(size_t offset, size_t n) const {
    std::vector<uint8_t> out(n);
    if (::pread(memfd, out.data(), n, static_cast<off_t>(offset)) != static_cast<ssize_t>(n)) throw std::runtime_error("pread");
    return out;
  }
};

std::string message(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + seed * 7) & 0xff);
  return s;
}

uint64_t word(const std::vector<uint8_t>& b, size_t at) {
  uint64_t v;
  std::memcpy(&v, b.data() + at, 8);
  return v;
}

TEST(the_layout_is_shm_ring_pys_byte_for_byte) {
  Pair p(4096);
  p.client->outgoing().put("abc");
  auto header = p.bytes(0, 16);
  CHECK(word(header, 0) == 0x53424D4853484D31ULL && word(header, 8) == 4096);
  auto req = p.bytes(shm::kHeader, shm::kCursors + 7);  // requests: head, tail, then the data
  CHECK(word(req, 0) == 7 && word(req, 64) == 0);
  CHECK(std::memcmp(req.data() + shm::kCursors, "\x03\x00\x00\x00" "abc", 7) == 0);
  p.server->outgoing().put("xy");                        // answers: after the requests' data
  auto resp = p.bytes(shm::kHeader + shm::kCursors + 4096, shm::kCursors + 6);
  CHECK(word(resp, 0) == 6 && std::memcmp(resp.data() + shm::kCursors, "\x02\x00\x00\x00" "xy", 6) == 0);
  uint64_t count = 0;
  CHECK(::read(p.efd_req, &count, 8) == 8 && count == 1);  // one wake-up per message
  std::string got;
  CHECK(p.server->incoming().get(&got) && got == "abc");
  CHECK(word(p.bytes(shm::kHeader, 72), 64) == 7);      // the consumer moved the tail
  CHECK(p.client->incoming().get(&got) && got == "xy");
}

TEST(the_handover_messages_are_shm_ring_pys) {
  CHECK(shm::hello("s-1") == std::string("SBSHM1\0s-1", 10));
  std::string answer("\x05\x00\x00\x00\x2a\x00\x00\x00\x00\x10\x00\x00\x00\x00\x00\x00" "no such session", 31);
  auto a = shm::parse_answer(answer);
  CHECK(a.code == 5 && a.reason == 42 && a.capacity == 4096 && a.message == "no such session");
  bool refused = false;
  try {
    shm::parse_answer("short");
  } catch (const std::invalid_argument&) {
    refused = true;
  }
  CHECK(refused);
}

TEST(messages_wrap_around_the_rings_end_intact_both_ways) {
  Pair p(4096);
  // Sizes that do not divide the capacity: the data and the length prefix straddle the end.
  size_t sent = 0;
  for (int i = 0; i < 300; ++i) {
    const std::string m = message(1 + (i * 577) % 1500, i);
    p.client->outgoing().put(m);
    std::string got;
    CHECK(p.server->incoming().get(&got, 0) && got == m);
    p.server->outgoing().put(m + "!");
    CHECK(p.client->incoming().get(&got, 0) && got == m + "!");
    sent += 4 + m.size();
  }
  CHECK(sent > 50 * 4096);
  CHECK(word(p.bytes(shm::kHeader, 8), 0) == sent);  // cursors count bytes ever written, never wrapped
  std::string got;
  CHECK(!p.server->incoming().ready() && !p.server->incoming().get(&got, 0));
}

TEST(a_message_that_can_never_fit_is_refused_and_one_that_fills_the_ring_passes) {
  Pair p(4096);
  bool too_big = false;
  try {
    p.client->outgoing().put(std::string(4096 - 3, 'x'));
  } catch (const shm::TooBig& e) {
    too_big = std::string(e.what()).find("4093 bytes does not fit the shared-memory ring of 4096") != std::string::npos;
  }
  CHECK(too_big);
  const std::string full = message(4096 - 4, 3);
  p.client->outgoing().put(full);
  std::string got;
  CHECK(p.server->incoming().get(&got, 0) && got == full);
}

TEST(a_full_ring_waits_for_room_and_drains_meanwhile) {
  Pair p(4096);
  const std::string m = message(1000, 1);
  for (int i = 0; i < 4; ++i) p.client->outgoing().put(m);  // 4 x 1004 bytes: no room for a fifth
  int calls = 0;
  std::string got;
  p.client->outgoing().put(m, [&] {  // the consumer takes one while the producer waits
    if (calls++ == 2) p.server->incoming().get(&got, 0);
  });
  CHECK(calls >= 3 && got == m);
  for (int i = 0; i < 4; ++i) CHECK(p.server->incoming().get(&got, 0) && got == m);
  CHECK(!p.server->incoming().ready());
}

TEST(a_peer_that_closes_its_socket_ends_a_wait_at_once) {
  Pair p(4096);
  std::string got;
  auto t0 = std::chrono::steady_clock::now();
  CHECK(!p.client->incoming().get(&got, 50));  // no message: a timeout, not an error
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(45));
  ::close(p.socks[0]);
  p.socks[0] = -1;
  t0 = std::chrono::steady_clock::now();
  bool gone = false;
  try {
    p.client->incoming().get(&got, 5000);
  } catch (const shm::PeerGone&) {
    gone = true;
  }
  CHECK(gone && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));
  const std::string m = message(3000, 2);
  gone = false;
  try {
    p.client->outgoing().put(m);
    p.client->outgoing().put(m);  // full: the consumer is gone, so no room will come
  } catch (const shm::PeerGone&) {
    gone = true;
  }
  CHECK(gone);
}

TEST(a_corrupt_length_is_a_broken_channel_not_a_huge_read) {
  Pair p(4096);
  p.client->outgoing().put("abcd");
  const uint32_t bad = 1u << 30;
  CHECK(::pwrite(p.memfd, &bad, 4, static_cast<off_t>(shm::kHeader + shm::kCursors)) == 4);
  std::string got;
  bool gone = false;
  try {
    p.server->incoming().get(&got, 0);
  } catch (const shm::PeerGone& e) {
    gone = std::string(e.what()).find("corrupt") != std::string::npos;
  }
  CHECK(gone);
}

TEST(shm_addresses_dial_their_unix_socket_and_hand_over_beside_it) {
  auto a = split_shm_address("shm+unix:/tmp/sb/bridge.sock");
  CHECK(a.grpc_target == "unix:/tmp/sb/bridge.sock" && a.handover == "/tmp/sb/bridge.sock.shm");
  a = split_shm_address("shm+unix:///tmp/sb/b.sock");
  CHECK(a.grpc_target == "unix:///tmp/sb/b.sock" && a.handover == "/tmp/sb/b.sock.shm");
  for (const char* other : {"127.0.0.1:50051", "unix:/tmp/sb/bridge.sock"}) {
    a = split_shm_address(other);
    CHECK(a.grpc_target == other && a.handover.empty());
  }
  CHECK_THROWS_REASON(split_shm_address("shm+unix:"), "INVALID_REQUEST");
  // 107 bytes a socket path, less 4 for PATH.shm (as simbridge/wire/addresses.py)
  CHECK_THROWS_REASON(split_shm_address("shm+unix:/" + std::string(103, 'a')), "INVALID_REQUEST");  // 104 bytes
  a = split_shm_address("shm+unix:/" + std::string(102, 'a'));                                      // 103: fits
  CHECK(a.handover.size() == 107);
}

// ---------------------------------------------------------------- open_shm and its stream

// The gRPC stream a channel rides beside: here it only records that it was closed.
struct IdleStream : StepStream {
  bool* closed;
  explicit IdleStream(bool* c) : closed(c) {}
  bool write(const pb::StreamRequest&) override { return true; }
  bool read(pb::StreamResponse*) override { return false; }
  grpc::Status close(bool) override {
    *closed = true;
    return grpc::Status::OK;
  }
};

// The bridge's end of one handover, in a thread: answers the hello with `refusal` (code, reason)
// or with a fresh region of `cap`, then answers each request with its seq (in error.message)
// until `serve` requests were answered, then hangs up.
struct FakeBridge {
  std::string dir, path;
  int listener = -1;
  std::string hello;
  std::thread thread;

  FakeBridge(uint64_t cap, int serve, uint32_t refusal_code = 0, uint32_t refusal_reason = 0) {
    char tmpl[] = "/tmp/sb-shm-test-XXXXXX";
    dir = ::mkdtemp(tmpl);
    path = dir + "/b.sock.shm";
    listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listener, 1) != 0)
      throw std::runtime_error("bind");
    thread = std::thread([this, cap, serve, refusal_code, refusal_reason] {
      int conn = ::accept(listener, nullptr, nullptr);
      char buf[512];
      ssize_t n = ::recv(conn, buf, sizeof buf, 0);
      hello.assign(buf, n > 0 ? static_cast<size_t>(n) : 0);
      std::string answer(16, '\0');
      const uint64_t capacity = refusal_code ? 0 : cap;
      std::memcpy(&answer[0], &refusal_code, 4);
      std::memcpy(&answer[4], &refusal_reason, 4);
      std::memcpy(&answer[8], &capacity, 8);
      if (refusal_code) {
        answer += "no such session";
        (void)!::send(conn, answer.data(), answer.size(), MSG_NOSIGNAL);
        ::close(conn);
        return;
      }
      int fds[3] = {::memfd_create("t", MFD_CLOEXEC), ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK),
                    ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
      (void)!::ftruncate(fds[0], static_cast<off_t>(shm::region_bytes(cap)));
      shm::Region region(fds[0], cap, fds[1], fds[2], conn, /*server=*/true, 0.0, /*fresh=*/true);
      iovec iov{&answer[0], answer.size()};
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof fds)] = {};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = sizeof control;
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof fds);
      std::memcpy(CMSG_DATA(c), fds, sizeof fds);
      (void)!::sendmsg(conn, &msg, MSG_NOSIGNAL);
      std::string data;
      for (int i = 0; i < serve; ++i) {
        if (!region.incoming().get(&data, 10000)) break;
        pb::StreamRequest req;
        req.ParseFromString(data);
        pb::StreamResponse resp;
        resp.mutable_error()->set_message(std::to_string(req.step().header().seq()));
        region.outgoing().put(resp.SerializeAsString());
      }
      ::close(conn);  // hangs up: the client's next read finds the channel broken
      for (int fd : fds) ::close(fd);
    });
  }
  ~FakeBridge() {
    if (thread.joinable()) thread.join();
    ::close(listener);
    ::unlink(path.c_str());
    ::rmdir(dir.c_str());
  }
};

pb::StreamRequest step(uint64_t seq) {
  pb::StreamRequest req;
  req.mutable_step()->mutable_header()->set_seq(seq);
  req.mutable_step()->mutable_header()->set_session_id(std::string(80, 's'));  // about 100 bytes a message
  return req;
}

TEST(pipelined_requests_beyond_a_full_ring_never_stall_and_answers_keep_their_order) {
  const int n = 2000;  // 200 kB of requests through 4 KiB rings, none read before all are sent
  FakeBridge bridge(4096, n);
  bool grpc_closed = false;
  pb::CreateSessionResponse session;
  session.set_session_id("s-123");
  session.mutable_limits()->set_max_message_bytes(1 << 20);
  auto stream = open_shm(bridge.path, std::make_unique<IdleStream>(&grpc_closed), &session);
  CHECK(bridge.hello == std::string("SBSHM1\0s-123", 12));
  CHECK(session.limits().max_message_bytes() == 4092);  // capped at what the ring holds
  for (int i = 1; i <= n; ++i) CHECK(stream->write(step(i)));
  pb::StreamResponse resp;
  int in_order = 0;
  for (int i = 1; i <= n && stream->read(&resp); ++i) in_order += resp.error().message() == std::to_string(i);
  CHECK(in_order == n);
  CHECK(!stream->read(&resp));  // the bridge hung up: a broken stream, retryable
  CHECK(stream->close(false).error_code() == grpc::StatusCode::UNAVAILABLE && grpc_closed);
}

TEST(a_refused_handover_is_the_error_it_carries_and_takes_the_grpc_stream_with_it) {
  FakeBridge bridge(4096, 0, 5, 3);  // NOT_FOUND, SESSION_UNKNOWN
  bool grpc_closed = false;
  pb::CreateSessionResponse session;
  session.set_session_id("s-gone");
  std::string reason = "<no error>";
  try {
    open_shm(bridge.path, std::make_unique<IdleStream>(&grpc_closed), &session);
  } catch (const Error& e) {
    reason = e.reason() + " " + e.what() + " " + std::to_string(static_cast<int>(e.code()));
  }
  CHECK(reason == "SESSION_UNKNOWN no such session 5");
  CHECK(grpc_closed);
}

}  // namespace

int main() { return run_all_tests(); }
