// The transport under a Connection's session (internal): the stream its requests and answers
// travel on, whichever carries them. A gRPC bidirectional Stream (connection.cpp), or the
// shared-memory channel beside one (shm_channel.cpp). The Connection's numbering, resume and
// resend sit above this and do not know which it has.
#pragma once

#include <grpcpp/support/status.h>

#include "simbridge/v1/simbridge.pb.h"

namespace simbridge {

class StepStream {
 public:
  virtual ~StepStream() = default;
  // false: the stream is broken; close() says why (a failure shows at the next read too).
  virtual bool write(const ::simbridge::v1::StreamRequest& req) = 0;
  // The next answer, in order; false when the stream ended or broke: close() says why.
  virtual bool read(::simbridge::v1::StreamResponse* resp) = 0;
  // End it (cancel: at once, without waiting for the server) and return how it ended: OK, or the
  // status of its failure, which the Connection retries when it is retryable(): a broken stream.
  virtual grpc::Status close(bool cancel) = 0;
};

}  // namespace simbridge
