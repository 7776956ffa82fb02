// Unit tests of the bridge address list (hosts.hpp): parsing and its errors, where a client starts,
// which address it tries last, and the probe's words for a closed port and a missing socket file.
#include <set>
#include <string>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.hpp"
#include "hosts.hpp"

using namespace simbridge;

namespace {

TEST(address_lists_split_on_commas_trim_and_drop_repeats) {
  CHECK(parse_addresses(" 127.0.0.1:1, 127.0.0.1:2 ,") == std::vector<std::string>({"127.0.0.1:1", "127.0.0.1:2"}));
  CHECK(parse_addresses("[::1]:50051,unix:/tmp/b.sock,127.0.0.1:1,[::1]:50051") ==
        std::vector<std::string>({"[::1]:50051", "unix:/tmp/b.sock", "127.0.0.1:1"}));
  CHECK(parse_addresses(std::vector<std::string>{"h:1", " h:2 ", "h:1"}) == std::vector<std::string>({"h:1", "h:2"}));
}

TEST(bad_address_lists_name_the_fix) {
  std::string msg = error_message([] { parse_addresses("127.0.0.1:1,localhost"); });
  CHECK(msg.find("address 'localhost' has no port: pass HOST:PORT") != std::string::npos);
  CHECK(error_message([] { parse_addresses(" , "); }).find("no address given (' , '): pass HOST:PORT, or several as") !=
        std::string::npos);
  CHECK(error_message([] { parse_addresses(std::vector<std::string>{}); }).find("no address given") != std::string::npos);
  CHECK(error_message([] { parse_addresses("h:1,unix-abstract:x"); }).find("abstract Unix sockets") != std::string::npos);
  CHECK(error_message([] { parse_addresses("unix:"); }).find("names no socket file") != std::string::npos);
  try {
    parse_addresses("h:1,h:port");
    CHECK(false);
  } catch (const Error& e) {
    CHECK(e.code() == StatusCode::INVALID_ARGUMENT);
  }
}

TEST(a_process_clients_start_one_address_apart_and_processes_spread) {
  // One process's clients go round the list: each start is one past the one before.
  size_t first = start_index(3), second = start_index(3), third = start_index(3);
  CHECK(second == (first + 1) % 3 && third == (first + 2) % 3);
  // Processes start where crc32("HOST/PID") says: over many pids, every address gets some.
  std::set<size_t> starts;
  for (int k = 0; k < 24; ++k) {  // all on one of two: a chance in 2^23
    pid_t pid = ::fork();
    if (pid == 0) _exit(static_cast<int>(start_index(2)));
    int status = 0;
    ::waitpid(pid, &status, 0);
    starts.insert(static_cast<size_t>(WEXITSTATUS(status)));
  }
  CHECK(starts == std::set<size_t>({0, 1}));
}

TEST(an_address_left_recently_is_tried_last_for_30_s) {
  std::vector<std::string> list = {"a:1", "b:1", "c:1"};
  CHECK(try_order(list, 1, 1000.0) == std::vector<std::string>({"b:1", "c:1", "a:1"}));
  mark_down("b:1", 1000.0);
  CHECK(try_order(list, 1, 1010.0) == std::vector<std::string>({"c:1", "a:1", "b:1"}));
  CHECK(try_order(list, 1, 1031.0) == std::vector<std::string>({"b:1", "c:1", "a:1"}));
}

TEST(a_probe_names_a_closed_port_and_a_missing_socket_file) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);  // a port bound, never listened on: connections are refused
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  socklen_t len = sizeof sa;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  Probe p = probe("127.0.0.1:" + std::to_string(ntohs(sa.sin_port)), false);
  ::close(fd);
  CHECK(p.closed && !p.hopeless && p.what == kNothingListens);
  p = probe("unix:/nonexistent/simbridge.sock", false);
  CHECK(p.closed && p.what.find("no socket file there") != std::string::npos);
}

TEST(a_probe_of_localhost_finds_a_server_on_the_loopback_the_resolver_does_not_name) {
  // gRPC resolves localhost to ::1 and 127.0.0.1; /etc/hosts may name 127.0.0.1 only, where a
  // probe that dialed the resolver's first address said "nothing listens" of a server on ::1.
  int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 sa{};
  sa.sin6_family = AF_INET6;
  sa.sin6_addr = in6addr_loopback;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || ::listen(fd, 4) != 0) {
    if (fd >= 0) ::close(fd);
    return;  // no IPv6 loopback on this machine: nothing to check
  }
  socklen_t len = sizeof sa;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  Probe p = probe("localhost:" + std::to_string(ntohs(sa.sin6_port)), false, 0.3);
  ::close(fd);
  CHECK(!p.closed && p.what != kNothingListens);
}

}  // namespace
