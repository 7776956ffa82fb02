// The log callback's default and its guard (see log.hpp).
#include "log.hpp"

#include <iostream>

namespace simbridge {

const char* log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::Debug: return "debug";
    case LogLevel::Info: return "info";
    case LogLevel::Warning: return "warning";
    case LogLevel::Error: return "error";
  }
  return "unknown";
}

void log_to_stderr(LogLevel, const std::string& message) {
  // One write per line, so lines from several clients' threads do not interleave mid-line.
  std::cerr << ("simbridge: " + message + "\n") << std::flush;
}

void emit(const LogCallback& log, LogLevel level, const std::string& message) {
  try {
    if (log) log(level, message);
    else log_to_stderr(level, message);
  } catch (...) {
  }
}

}  // namespace simbridge
