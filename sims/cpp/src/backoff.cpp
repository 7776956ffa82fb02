#include "backoff.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

namespace simbridge {

std::string fmt_s(double s) { return std::to_string(static_cast<long long>(s + 0.5)) + "s"; }

double monotonic_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Backoff::Backoff(double patience_s, double first_s, double max_s, Clock now, Sleep sleep)
    : patience_s_(patience_s), delay_s_(first_s), max_s_(max_s), now_(std::move(now)), sleep_(std::move(sleep)) {
  if (!sleep_) sleep_ = [](double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); };
}

bool Backoff::wait() {
  double now = now_();
  if (since_ < 0) since_ = now;
  if (now - since_ >= patience_s_) return false;
  sleep_(delay_s_);
  delay_s_ = std::min(delay_s_ * 2, max_s_);
  return true;
}

}  // namespace simbridge
