// The shared-memory rings (see shm_ring.hpp). Linux only: CMakeLists.txt builds this file there.
#include "shm_ring.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the shared-memory ring's words are little-endian (simbridge/wire/shm_ring.py): a little-endian host only"
#endif

namespace simbridge {
namespace shm {

namespace {
// The cursors are single aligned 8-byte words shared with another process: acquire/release so the
// bytes of a message are visible before the cursor that publishes them (the eventfd write, a
// system call, orders them too, as the Python end relies on).
uint64_t load(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
void store(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }
}  // namespace

// ---------------------------------------------------------------- Ring

Ring::Ring(uint8_t* ring, uint64_t capacity, int efd, int sock, double spin_s)
    : head_(reinterpret_cast<uint64_t*>(ring)), tail_(reinterpret_cast<uint64_t*>(ring + 64)),
      data_(ring + kCursors), capacity_(capacity), efd_(efd), sock_(sock), spin_s_(spin_s) {}

void Ring::copy_in(uint64_t pos, const void* data, size_t n) {
  const size_t at = pos % capacity_;
  const size_t first = std::min<size_t>(n, capacity_ - at);
  std::memcpy(data_ + at, data, first);
  if (first < n) std::memcpy(data_, static_cast<const uint8_t*>(data) + first, n - first);
}

void Ring::copy_out(uint64_t pos, void* out, size_t n) const {
  const size_t at = pos % capacity_;
  const size_t first = std::min<size_t>(n, capacity_ - at);
  std::memcpy(out, data_ + at, first);
  if (first < n) std::memcpy(static_cast<uint8_t*>(out) + first, data_, n - first);
}

void Ring::put(const std::string& data, const std::function<void()>& while_full) {
  const uint64_t n = data.size(), need = 4 + n;
  if (need > capacity_)
    throw TooBig("a message of " + std::to_string(n) + " bytes does not fit the shared-memory ring of " +
                 std::to_string(capacity_) + " bytes");
  const uint64_t head = *head_;  // ours alone to move
  double pause_s = 20e-6;
  // Room is rarely short (a pipelined burst): the consumer sends no wake-up for it, so look again
  // after a sleep that doubles up to 2 ms; a consumer that is gone ends the wait.
  while (capacity_ - (head - load(tail_)) < need) {
    if (while_full) while_full();
    check_peer();
    std::this_thread::sleep_for(std::chrono::duration<double>(pause_s));
    pause_s = std::min(pause_s * 2, 2e-3);
  }
  const uint32_t len = static_cast<uint32_t>(n);
  copy_in(head, &len, 4);
  copy_in(head + 4, data.data(), n);
  store(head_, head + need);
  const uint64_t one = 1;
  if (::write(efd_, &one, sizeof one) < 0 && errno != EAGAIN) throw PeerGone(errno_text("eventfd write"));
}

bool Ring::ready() const { return load(head_) != *tail_; }

bool Ring::get(std::string* out, int timeout_ms) {
  if (!ready()) {
    if (spin_s_ > 0) {
      const double until = now_s() + spin_s_;
      while (!ready() && now_s() < until) {
      }
    }
    if (!ready() && !block(timeout_ms)) return false;
  }
  const uint64_t tail = *tail_;  // ours alone to move
  uint32_t n;
  copy_out(tail, &n, 4);
  if (n > capacity_ - 4) throw PeerGone("the shared-memory ring is corrupt (a length of " + std::to_string(n) + " bytes)");
  out->resize(n);
  copy_out(tail + 4, &(*out)[0], n);
  store(tail_, tail + 4 + n);
  return true;
}

bool Ring::block(int timeout_ms) {
  const double deadline = timeout_ms < 0 ? 0 : now_s() + timeout_ms / 1000.0;
  while (!ready()) {
    int wait_ms = -1;
    if (timeout_ms >= 0) wait_ms = static_cast<int>(std::max(0.0, (deadline - now_s()) * 1000.0));
    pollfd fds[2] = {{efd_, POLLIN, 0}, {sock_, POLLIN, 0}};  // POLLHUP and POLLERR come unasked
    int got = ::poll(fds, 2, wait_ms);
    if (got < 0 && errno != EINTR) throw PeerGone(errno_text("poll on the shared-memory channel"));
    if (got > 0 && (fds[0].revents & POLLIN)) {
      uint64_t count;
      (void)!::read(efd_, &count, sizeof count);  // non-blocking: a wake-up taken while spinning reads EAGAIN
    }
    if (ready()) return true;
    if (got > 0 && fds[1].revents) check_peer();
    if (timeout_ms >= 0 && now_s() >= deadline) return false;
  }
  return true;
}

void Ring::check_peer() const {
  char byte;
  ssize_t got = ::recv(sock_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (got == 0) throw PeerGone("the other end closed the shared-memory channel");
  if (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
    throw PeerGone(errno_text("the shared-memory channel's socket failed"));
}

// ---------------------------------------------------------------- Region

uint8_t* Region::map(int memfd, uint64_t capacity, bool fresh) {
  if (capacity < kMinRingBytes || capacity > (uint64_t{1} << 40))
    throw std::invalid_argument("the shared-memory ring's capacity " + std::to_string(capacity) + " is out of range");
  const size_t size = region_bytes(capacity);
  struct stat st;
  if (::fstat(memfd, &st) != 0) throw std::invalid_argument(errno_text("fstat of the shared-memory region"));
  if (static_cast<uint64_t>(st.st_size) < size)
    throw std::invalid_argument("the shared-memory region is smaller than its rings");
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (p == MAP_FAILED) throw std::invalid_argument(errno_text("mmap of the shared-memory region"));
  auto* words = static_cast<uint64_t*>(p);
  if (fresh) {
    words[0] = kMagic;
    words[1] = capacity;
  } else if (words[0] != kMagic || words[1] != capacity) {
    ::munmap(p, size);
    throw std::invalid_argument("the shared-memory region is not a simbridge channel of this version");
  }
  return static_cast<uint8_t*>(p);
}

Region::Region(int memfd, uint64_t capacity, int efd_requests, int efd_answers, int sock, bool server, double spin_s,
               bool fresh)
    : base_(map(memfd, capacity, fresh)), size_(region_bytes(capacity)), server_(server),
      requests_(base_ + kHeader, capacity, efd_requests, sock, spin_s),
      answers_(base_ + kHeader + kCursors + capacity, capacity, efd_answers, sock, spin_s) {}

Region::~Region() { ::munmap(base_, size_); }

// ---------------------------------------------------------------- the handover's messages

namespace {
const char kHello[] = "SBSHM1";  // and its NUL: 7 bytes, as shm_ring.HELLO
constexpr size_t kAnswerFixed = 16;  // <IIQ
}  // namespace

std::string hello(const std::string& session_id) { return std::string(kHello, sizeof kHello) + session_id; }

Answer parse_answer(const std::string& data) {
  if (data.size() < kAnswerFixed) throw std::invalid_argument("a short answer on the shared-memory handover socket");
  Answer a;
  std::memcpy(&a.code, data.data(), 4);
  std::memcpy(&a.reason, data.data() + 4, 4);
  std::memcpy(&a.capacity, data.data() + 8, 8);
  a.message = data.substr(kAnswerFixed);
  return a;
}

double client_spin_s() {
  const char* v = std::getenv("SIMBRIDGE_SHM_SPIN_US");
  if (!v || !*v) return 0;
  char* end;
  double us = std::strtod(v, &end);
  return (*end == '\0' && us > 0) ? us / 1e6 : 0;
}

}  // namespace shm
}  // namespace simbridge
