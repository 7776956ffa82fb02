// The SDK's diagnostics (internal): every message goes through emit, to the client's log callback
// (simbridge/options.hpp), so an engine that owns its log gets them all and std::cerr none.
#pragma once

#include <string>

#include "simbridge/options.hpp"

namespace simbridge {

// To `log`, or to log_to_stderr when it is empty; an exception from the callback is dropped (a
// diagnostic must never turn into a failed call, nor break a reconnect half way).
void emit(const LogCallback& log, LogLevel level, const std::string& message);

}  // namespace simbridge
