// Waits between attempts of one failing call (internal; as simbridge/client/connection.py's Backoff).
#pragma once

#include <functional>
#include <limits>
#include <string>

namespace simbridge {

double monotonic_s();
// A patience for messages, in whole seconds: "30s".
std::string fmt_s(double s);

// `first_s`, doubling up to `max_s`, for at most `patience_s` since the first failure.
class Backoff {
 public:
  using Clock = std::function<double()>;
  using Sleep = std::function<void(double)>;
  explicit Backoff(double patience_s = std::numeric_limits<double>::infinity(), double first_s = 0.05,
                   double max_s = 1.0, Clock now = monotonic_s, Sleep sleep = {});
  // Sleep before the next attempt; false (no sleep) once the patience is spent.
  bool wait();

 private:
  double patience_s_, delay_s_, max_s_, since_ = -1;
  Clock now_;
  Sleep sleep_;
};

}  // namespace simbridge
