// Finding a bridge host (internal; as simbridge/client/channels.py): the address list, where a new
// client starts in it, a ready channel to one of several addresses (connect_any), and why an
// address serves nothing, in words (probe).
//
// Several addresses come as "h1:p1,h2:p2" or a list. A client starts at start_index: a hash of
// the host name and process id, plus one for each client this process made before, so simulator
// processes spread over the addresses and the clients of one process go round them. An address a
// client of this process moved away from (mark_down) is tried last for 30 s.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "credentials.hpp"
#include "log.hpp"

namespace simbridge {

// With other addresses to go to, how long a client tries to resume on the server it lost before it
// moves: a broken stream to a live server resumes in milliseconds; a server that stopped answering
// for this long has lost the session's open episodes anyway (they end at its timeout).
constexpr double kFailoverAfterS = 2.0;
// gRPC's grpc.min_reconnect_backoff_ms, which gRPC core takes as one connection attempt's deadline
// (handshake included), as simbridge/wire/grpc_tuning.py's CONNECT_ATTEMPT_MS: see new_channel.
constexpr int kConnectAttemptMs = 2000;

// probe's words for a port (or socket file) where nothing serves: its sessions are gone.
extern const char* const kNothingListens;

// "h1:p1, h2:p2" or a list: each address trimmed, empty ones dropped, repeats dropped (first kept),
// each checked (HOST:PORT, unix:PATH, shm+unix:PATH). Error INVALID_ARGUMENT naming the fix.
std::vector<std::string> parse_addresses(const std::string& addresses);
std::vector<std::string> parse_addresses(const std::vector<std::string>& addresses);

// Where a new client starts in n addresses: crc32("HOST/PID") plus the clients this process made
// before (each call counts one).
size_t start_index(size_t n);
// The addresses from `start` round, those marked down in the last 30 s last. `now_s`: monotonic_s().
std::vector<std::string> try_order(const std::vector<std::string>& addresses, size_t start, double now_s);
void mark_down(const std::string& address, double now_s);

// Why nothing serves at an address, in words, and whether that is final: nothing listens (a
// trainer may still come; `closed`), the host does not answer, something that is not a gRPC server
// answers (an HTTP/1 server: `hopeless`). Looks for at most about 2 x timeout_s.
struct Probe {
  std::string what;
  bool closed = false;    // nothing listens there: a server that comes back there has lost the session
  bool hopeless = false;  // waiting will not change it
};
Probe probe(const std::string& address, bool tls, double timeout_s = 1.0);

// A channel to one address, with every simbridge client's channel arguments.
std::shared_ptr<grpc::Channel> new_channel(const std::string& address, const Credentials& creds);

// The first of `addresses`, in their order, whose server answers, and a ready channel to it. One
// address: wait_connected's wait and errors. Several: each gets a short look in turn (0.3 s; one
// that cannot answer is dropped) until timeout_s is spent; then an Error UNAVAILABLE naming every
// address and what was found there.
std::pair<std::string, std::shared_ptr<grpc::Channel>> connect_any(const std::vector<std::string>& addresses,
                                                                   const Credentials& creds, double timeout_s,
                                                                   const LogCallback& log);

}  // namespace simbridge
