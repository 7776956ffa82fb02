// Finding a bridge host (see hosts.hpp).
#include "hosts.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "backoff.hpp"
#include "shm_channel.hpp"

namespace simbridge {

const char* const kNothingListens = "nothing listens there (connection refused)";

namespace {
constexpr double kDownForS = 30.0;
constexpr size_t kMaxSocketPath = 107;  // Linux's sun_path holds 108 bytes with the terminating NUL
std::mutex down_mu;
std::map<std::string, double> down_since;  // address -> when a client of this process moved away from it
std::atomic<size_t> clients_made{0};

Error bad_address(const std::string& message) {
  return Error(StatusCode::INVALID_ARGUMENT, message + " (the trainer's [server] address)", "INVALID_REQUEST");
}

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// "unix:/a/b" and "unix:///a/b" -> "/a/b"; "unix:rel.sock" -> "rel.sock".
std::string unix_path(const std::string& address) {
  std::string path = address.substr(5);
  return path.compare(0, 2, "//") == 0 ? path.substr(2) : path;
}

void check_address(const std::string& a) {
  if (a.compare(0, 14, "unix-abstract:") == 0)
    throw bad_address("address '" + a + "': abstract Unix sockets have no file permissions (any local user could "
                      "connect): use unix:PATH, e.g. unix:/tmp/simbridge/bridge.sock");
  if (a.compare(0, 9, "shm+unix:") == 0) {
    split_shm_address(a);  // its own checks and words
    return;
  }
  if (a.compare(0, 5, "unix:") == 0) {
    std::string path = unix_path(a);
    if (path.empty())
      throw bad_address("address '" + a + "' names no socket file: pass unix:PATH, e.g. unix:/tmp/simbridge/bridge.sock");
    if (path.size() > kMaxSocketPath)
      throw bad_address("address '" + a + "': the socket path is " + std::to_string(path.size()) +
                        " bytes, longer than the " + std::to_string(kMaxSocketPath) +
                        " a Unix socket allows: pick a shorter path, e.g. unix:/tmp/simbridge/bridge.sock");
    return;
  }
  size_t colon = a.rfind(':');
  std::string port = colon == std::string::npos ? "" : a.substr(colon + 1);
  if (colon == std::string::npos || colon == 0 || port.empty() ||
      !std::all_of(port.begin(), port.end(), [](unsigned char c) { return std::isdigit(c); }))
    throw bad_address("address '" + a + "' has no port: pass HOST:PORT, e.g. 127.0.0.1:50051, or unix:PATH for a "
                      "Unix socket on this machine");
  // As the Python SDK: gRPC takes 99999 as 99999 - 65536 and dials that port.
  if (port.size() > 9 || std::stol(port) > 65535)   // 9 digits: within a long, leading zeros allowed
    throw bad_address("address '" + a + "': port " + port + " is past 65535: pass a port from 1 to 65535, e.g. 50051");
}

uint32_t crc32(const std::string& s) {  // zlib's CRC-32, so a process starts where Python's would
  uint32_t c = 0xffffffffu;
  for (unsigned char byte : s) {
    c ^= byte;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return c ^ 0xffffffffu;
}

// A connected socket to `address` (fd >= 0), or -1 and why nothing serves there.
int dial(const std::string& address, double timeout_s, Probe* why) {
  const int timeout_ms = static_cast<int>(timeout_s * 1000);
  int fd = -1, err = 0;
  if (address.compare(0, 5, "unix:") == 0) {
    std::string path = unix_path(address);
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      *why = {"no socket file there (no server has created it, or it stopped)", true, false};
      return -1;
    }
    if (!S_ISSOCK(st.st_mode)) {
      *why = {path + " is not a socket (a regular file or directory): pass the path the trainer's --address "
              "unix:PATH names", false, true};
      return -1;
    }
    fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::memcpy(sa.sun_path, path.data(), std::min(path.size(), sizeof(sa.sun_path) - 1));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) return fd;
    err = errno;
    ::close(fd);
    if (err == ECONNREFUSED) *why = {"nothing listens there (a stale socket file: connection refused)", true, false};
    else if (err == EACCES)
      *why = {"permission denied on " + path + " (the server makes its socket owner-only: run the simulator as "
              "the trainer's user)", false, true};
    else *why = {std::string("the socket does not answer (") + std::strerror(err) + ")", false, false};
    return -1;
  }
  size_t colon = address.rfind(':');
  std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  // Every address gRPC may try, in turn: the system resolver's, and for localhost its two loopbacks
  // (gRPC's own resolver gives ::1 too where /etc/hosts names 127.0.0.1 only). The first alone
  // said "nothing listens" of a server on the other.
  std::vector<std::string> names = {host};
  if (host == "localhost") names = {"::1", "127.0.0.1"};  // its loopbacks, each dialed once
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  bool resolved = false, refused = false;
  std::string other;  // the last failure that is not a refusal
  for (const std::string& name : names) {
    addrinfo* res = nullptr;
    if (int rc = ::getaddrinfo(name.c_str(), port.c_str(), &hints, &res); rc != 0) {
      if (name == host) *why = {"cannot resolve host '" + host + "' (" + gai_strerror(rc) + ")", false, true};
      continue;
    }
    resolved = true;
    for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
      fd = ::socket(ai->ai_family, SOCK_STREAM, 0);
      if (fd < 0) continue;
      ::fcntl(fd, F_SETFL, O_NONBLOCK);
      err = 0;
      if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        err = errno;
        if (err == EINPROGRESS) {
          pollfd p{fd, POLLOUT, 0};
          socklen_t len = sizeof err;
          err = ::poll(&p, 1, timeout_ms) == 1 ? (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len), err)
                                               : ETIMEDOUT;
        }
      }
      if (err == 0) {
        ::freeaddrinfo(res);
        return fd;
      }
      ::close(fd);
      if (err == ECONNREFUSED) refused = true;
      else other = std::string("the host does not answer (") + (err == ETIMEDOUT ? "timed out" : std::strerror(err)) + ")";
    }
    ::freeaddrinfo(res);
  }
  if (!resolved) return -1;  // *why: the host's name did not resolve
  if (!other.empty() || !refused) *why = {other.empty() ? "the host does not answer" : other, false, false};
  else *why = {kNothingListens, true, false};
  return -1;
}
}  // namespace

std::vector<std::string> parse_addresses(const std::vector<std::string>& addresses) {
  std::vector<std::string> out;
  for (const auto& given : addresses) {
    std::string a = trim(given);
    if (a.empty() || std::find(out.begin(), out.end(), a) != out.end()) continue;
    check_address(a);
    out.push_back(a);
  }
  if (out.empty()) {
    std::string joined;
    for (const auto& a : addresses) joined += (joined.empty() ? "'" : ", '") + a + "'";
    throw Error(StatusCode::INVALID_ARGUMENT,
                "no address given ([" + joined + "]): pass HOST:PORT, or several as \"h1:p1,h2:p2\"", "INVALID_REQUEST");
  }
  return out;
}

std::vector<std::string> parse_addresses(const std::string& addresses) {
  std::vector<std::string> items;
  size_t from = 0;
  for (size_t comma; (comma = addresses.find(',', from)) != std::string::npos; from = comma + 1)
    items.push_back(addresses.substr(from, comma - from));
  items.push_back(addresses.substr(from));
  if (std::all_of(items.begin(), items.end(), [](const std::string& a) { return trim(a).empty(); }))
    throw Error(StatusCode::INVALID_ARGUMENT,
                "no address given ('" + addresses + "'): pass HOST:PORT, or several as \"h1:p1,h2:p2\"", "INVALID_REQUEST");
  return parse_addresses(items);
}

size_t start_index(size_t n) {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  uint32_t base = crc32(std::string(host) + "/" + std::to_string(::getpid()));
  return (static_cast<size_t>(base) + clients_made++) % n;
}

std::vector<std::string> try_order(const std::vector<std::string>& addresses, size_t start, double now_s) {
  std::vector<std::string> fresh, recent;
  std::lock_guard<std::mutex> lock(down_mu);
  for (size_t k = 0; k < addresses.size(); ++k) {
    const std::string& a = addresses[(start + k) % addresses.size()];
    auto it = down_since.find(a);
    (it != down_since.end() && now_s - it->second < kDownForS ? recent : fresh).push_back(a);
  }
  fresh.insert(fresh.end(), recent.begin(), recent.end());
  return fresh;
}

void mark_down(const std::string& address, double now_s) {
  std::lock_guard<std::mutex> lock(down_mu);
  down_since[address] = now_s;
}

Probe probe(const std::string& address, bool tls, double timeout_s) {
  Probe why;
  int fd = dial(address, timeout_s, &why);
  if (fd < 0) return why;
  // Not hopeless: a trainer binds its port a few seconds before it serves, and that looks the same
  // as a failed handshake from here.
  if (tls) {
    ::close(fd);
    return {"a server answers but the TLS handshake or the gRPC connection failed", false, false};
  }
  // An HTTP/1 request: an HTTP/1 server answers with a status line; a gRPC server (HTTP/2 only) does not.
  static const char kHttp1[] = "GET / HTTP/1.1\r\nHost: simbridge\r\n\r\n";
  char answer[64] = {0};
  ssize_t got = 0;
  if (::send(fd, kHttp1, sizeof kHttp1 - 1, MSG_NOSIGNAL) > 0) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout_s * 1000)) == 1) got = ::recv(fd, answer, sizeof answer - 1, 0);
  }
  ::close(fd);
  std::string text(answer, got > 0 ? static_cast<size_t>(got) : 0);
  if (text.compare(0, 6, "HTTP/1") == 0)
    return {"an HTTP/1 server answers there ('" + text.substr(0, text.find("\r\n")) +
                "'), not a gRPC server (a web server, TensorBoard?)", false, true};
  if (text.size() >= 9 && text[3] == 0x04)  // an HTTP/2 SETTINGS frame: a gRPC server, not ready yet
    return {"a gRPC server answers there but the connection did not get ready", false, false};
  if (!text.empty() && (text[0] == 0x15 || text[0] == 0x16))
    return {"a TLS server answers there: connect with TLS (tls_ca_file / --tls-ca, docs/security.md)", false, true};
  return {"something listens there but does not answer as a gRPC server (yet: a trainer still starting?)", false, false};
}

std::shared_ptr<grpc::Channel> new_channel(const std::string& address, const Credentials& creds) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 * 1024 * 1024);
  args.SetMaxSendMessageSize(256 * 1024 * 1024);
  args.SetInt("grpc.keepalive_time_ms", 10000);
  args.SetInt("grpc.keepalive_timeout_ms", 5000);
  // A restarted server is found within a second, not gRPC's default two minutes of backoff.
  args.SetInt("grpc.initial_reconnect_backoff_ms", 100);
  args.SetInt("grpc.max_reconnect_backoff_ms", 1000);
  // Not a backoff at all: gRPC core takes it as one connection attempt's deadline, handshake
  // included. At 100 ms a server whose HTTP/2 SETTINGS came after it (a busy host, a slow link
  // with TLS) was never reached; gRPC's default, 20 s, would hold a client 20 s on a host that
  // accepts but never answers before it moves to another address. 2 s: both, as the Python
  // clients (simbridge/wire/grpc_tuning.py).
  args.SetInt("grpc.min_reconnect_backoff_ms", kConnectAttemptMs);
  creds.configure(args);
  return grpc::CreateCustomChannel(split_shm_address(address).grpc_target, creds.channel(), args);
}

namespace {
bool ready_within(const std::shared_ptr<grpc::Channel>& channel, double s) {
  const auto until = std::chrono::system_clock::now() + std::chrono::microseconds(static_cast<int64_t>(s * 1e6));
  for (auto state = channel->GetState(true); state != GRPC_CHANNEL_READY; state = channel->GetState(true))
    if (!channel->WaitForStateChange(state, until)) return false;
  return true;
}
}  // namespace

std::pair<std::string, std::shared_ptr<grpc::Channel>> connect_any(const std::vector<std::string>& addresses,
                                                                   const Credentials& creds, double timeout_s,
                                                                   const LogCallback& log) {
  if (addresses.size() == 1) {
    auto channel = new_channel(addresses[0], creds);
    wait_connected(channel, creds, addresses[0], timeout_s);
    return {addresses[0], channel};
  }
  std::vector<std::pair<std::string, std::shared_ptr<grpc::Channel>>> pending;  // a channel each, made at its first turn
  for (const auto& a : addresses) pending.emplace_back(a, nullptr);
  std::map<std::string, std::string> why;
  const double deadline = monotonic_s() + timeout_s;
  bool told = false;
  while (true) {
    for (auto it = pending.begin(); it != pending.end();) {
      if (!it->second) it->second = new_channel(it->first, creds);
      if (ready_within(it->second, std::max(0.0, std::min(0.3, deadline - monotonic_s())))) return *it;
      Probe p = probe(split_shm_address(it->first).grpc_target, creds.tls());
      why[it->first] = p.what;
      it = p.hopeless ? pending.erase(it) : it + 1;
    }
    if (pending.empty() || monotonic_s() >= deadline) {
      std::string said;
      for (const auto& a : addresses) said += (said.empty() ? "" : "; ") + a + ": " + (why.count(a) ? why[a] : "not tried");
      throw Error(StatusCode::UNAVAILABLE,
                  "no simbridge trainer at any of " + std::to_string(addresses.size()) + " addresses (" + said +
                      "): start a trainer at one of them, or pass the trainers' addresses",
                  "SERVER_UNAVAILABLE");
    }
    if (!told) {
      told = true;
      std::string all;
      for (const auto& a : addresses) all += (all.empty() ? "" : ", ") + a;
      emit(log, LogLevel::Info, "no simbridge trainer at any of " + all + " yet; waiting up to " + fmt_s(timeout_s) + " for one");
    }
  }
}

}  // namespace simbridge
