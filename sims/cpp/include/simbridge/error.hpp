// The SDK's errors: a status code of its own (the canonical RPC codes, same numbers as gRPC's, so
// the public headers need no gRPC header) and the ErrorReason name the server gave.
#pragma once

#include <stdexcept>
#include <string>

namespace simbridge {

// The canonical status codes (google.rpc.Code), numbered as on the wire.
enum class StatusCode : int {
  OK = 0,
  CANCELLED = 1,
  UNKNOWN = 2,
  INVALID_ARGUMENT = 3,
  DEADLINE_EXCEEDED = 4,
  NOT_FOUND = 5,
  ALREADY_EXISTS = 6,
  PERMISSION_DENIED = 7,
  RESOURCE_EXHAUSTED = 8,
  FAILED_PRECONDITION = 9,
  ABORTED = 10,
  OUT_OF_RANGE = 11,
  UNIMPLEMENTED = 12,
  INTERNAL = 13,
  UNAVAILABLE = 14,
  DATA_LOSS = 15,
  UNAUTHENTICATED = 16,
};
// "UNAVAILABLE", ... (for logs and messages); "UNKNOWN" for a number outside the enum.
const char* status_code_name(StatusCode code);

// A failed call: its status code and the ErrorReason name the server gave (its
// google.rpc.ErrorInfo), e.g. "QUEUE_FULL"; branch on reason(), never on the message.
class Error : public std::runtime_error {
 public:
  Error(StatusCode code, const std::string& message, std::string reason = "");
  StatusCode code() const { return code_; }
  std::string reason() const { return reason_; }

 private:
  StatusCode code_;
  std::string reason_;
};

// The server no longer knew this client's session after a reconnect (it restarted or expired
// it), or the client moved to another of its addresses because its host went away: its open
// episodes are gone (a later call naming one: Error FAILED_PRECONDITION, "EPISODE_ENDED"; a
// SlotClient's next step without an outcome starts every slot's new episode). The client goes on
// with a new session: start new episodes. code() UNAVAILABLE, reason() "SESSION_UNKNOWN".
class SessionLost : public Error {
 public:
  using Error::Error;
};

}  // namespace simbridge
