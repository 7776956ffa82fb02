// The shared-memory step channel's rings and wake-ups (internal, Linux only), byte for byte the
// layout of simbridge/wire/shm_ring.py, whose end the bridge runs (docs/transports.md).
//
// One memfd, passed over the owner-only handover socket with SCM_RIGHTS, holds a 64-byte header
// (magic, capacity: little-endian uint64s) and two single-producer single-consumer rings, requests
// (simulator -> bridge) then answers. A ring is two cursors, `head` (bytes ever written, moved by
// its producer) at +0 and `tail` (bytes ever read, moved by its consumer) at +64, one cache line
// each, then `capacity` bytes of data. A message is a 4-byte little-endian length and the
// serialized StreamRequest / StreamResponse, wrapping around the data's end (its length too).
//
// Wake-ups: after each message the producer writes 1 to the ring's eventfd. A consumer spins on
// the cursor for up to spin_s (0 by default: on a small machine a spinning end takes the core its
// peer needs), then blocks in poll() on the eventfd and the handover socket, so a peer that dies
// (its end of the socket closes) wakes it too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

namespace simbridge {
namespace shm {

constexpr uint64_t kMagic = 0x53424D4853484D31ULL;  // "SBMHSHM1"
constexpr size_t kHeader = 64;
constexpr size_t kCursors = 128;
constexpr uint64_t kMinRingBytes = 4096;
inline size_t region_bytes(uint64_t capacity) { return kHeader + 2 * (kCursors + capacity); }

// The other end closed its handover socket (it stopped, or its process died), or the ring is corrupt.
struct PeerGone : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A message that can never fit the ring.
struct TooBig : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One direction of the channel, seen from one end. Not thread-safe: one producer, one consumer.
class Ring {
 public:
  Ring(uint8_t* ring, uint64_t capacity, int efd, int sock, double spin_s);

  // Append one message and wake the consumer. While the ring is full, calls `while_full` (the
  // producer's chance to drain its own incoming ring) between short sleeps. TooBig, PeerGone.
  void put(const std::string& data, const std::function<void()>& while_full = {});
  bool ready() const;
  // The next message into *out; false after timeout_ms (-1: wait as long as it takes). PeerGone.
  bool get(std::string* out, int timeout_ms = -1);
  uint64_t capacity() const { return capacity_; }

 private:
  bool block(int timeout_ms);
  void check_peer() const;
  void copy_in(uint64_t pos, const void* data, size_t n);
  void copy_out(uint64_t pos, void* out, size_t n) const;

  uint64_t* head_;
  uint64_t* tail_;
  uint8_t* data_;
  uint64_t capacity_;
  int efd_, sock_;
  double spin_s_;
};

// The mapped region and its two rings from one end's point of view. `fresh`: write the header
// (the bridge's side, and the tests'); otherwise it must carry the magic and `capacity`.
// Owns the mapping only: the fds stay the caller's.
class Region {
 public:
  Region(int memfd, uint64_t capacity, int efd_requests, int efd_answers, int sock, bool server, double spin_s,
         bool fresh = false);
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;
  Ring& incoming() { return server_ ? requests_ : answers_; }
  Ring& outgoing() { return server_ ? answers_ : requests_; }

 private:
  static uint8_t* map(int memfd, uint64_t capacity, bool fresh);
  uint8_t* base_;
  size_t size_;
  bool server_;
  Ring requests_, answers_;
};

// The handover: the simulator sends hello(session id); the bridge answers status code (0: OK,
// else a gRPC code), ErrorReason number, ring capacity (<IIQ) and a message, with the region's
// memfd and the two eventfds when it is OK.
std::string hello(const std::string& session_id);
struct Answer {
  uint32_t code = 0, reason = 0;
  uint64_t capacity = 0;
  std::string message;
};
// std::invalid_argument when `data` is shorter than the fixed part.
Answer parse_answer(const std::string& data);

// SIMBRIDGE_SHM_SPIN_US (the simulator, waiting for an answer), in seconds; 0 when unset or not a number.
double client_spin_s();

}  // namespace shm
}  // namespace simbridge
