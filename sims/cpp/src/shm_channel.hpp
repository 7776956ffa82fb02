// The simulator's end of the shared-memory step channel (internal; `shm+unix:PATH` addresses,
// docs/transports.md), as simbridge/client/shm_channel.py is the Python client's.
//
// The Connection opens (or resumes) its session on a gRPC stream over unix:PATH as for any
// address, then hands it to open_shm: connect to the handover socket PATH.shm, name the session,
// receive the region's memfd and two eventfds (SCM_RIGHTS), map the rings (shm_ring.hpp). From
// then on the session's requests and answers go through the rings as the same serialized bytes,
// and the gRPC stream stays open beside them, idle. A peer gone or a failed channel ends the
// StepStream with UNAVAILABLE: to the Connection a broken stream (reconnect, resume, a fresh
// channel, resend the unanswered).
#pragma once

#include <memory>
#include <string>

#include "step_stream.hpp"

namespace simbridge {

// Where an address's steps go. `grpc_target` is what gRPC dials ("shm+unix:PATH" -> "unix:PATH",
// anything else as it is); `handover` is the handover socket's path (PATH.shm), empty when the
// address is not shm+unix:. Error INVALID_ARGUMENT, naming the fix, for an shm+unix: address that
// cannot work: no path, a path too long for a socket beside its PATH.shm, or a platform other
// than Linux.
struct ShmAddress {
  std::string grpc_target, handover;
};
ShmAddress split_shm_address(const std::string& address);

// The channel of `session` (just created or resumed on `grpc_stream`), which it keeps open and
// cancels when the channel ends. Caps session->limits.max_message_bytes at what the ring holds.
// A refusal of the server's is raised as the Error it names (its code and ErrorReason); a socket
// that cannot be reached or a handover that fails as UNAVAILABLE (the Connection retries it).
// On an error `grpc_stream` is cancelled too: the session's stream goes with its channel.
std::unique_ptr<StepStream> open_shm(const std::string& handover, std::unique_ptr<StepStream> grpc_stream,
                                     ::simbridge::v1::CreateSessionResponse* session, double timeout_s = 10.0);

}  // namespace simbridge
