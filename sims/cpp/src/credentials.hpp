// Who the client talks to and who it says it is (internal): the channel's TLS credentials from
// ClientOptions' PEM files, and the token every call carries as "authorization: Bearer <token>".
//
// The token travels as plain per-call metadata, not as gRPC call credentials: gRPC refuses to send
// call credentials on an insecure channel, and a loopback server may check a token without TLS
// (as the Python clients do). On a non-loopback address use TLS, or the token travels in clear.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "simbridge/client.hpp"

namespace simbridge {

class Credentials {
 public:
  // Reads the PEM and token files now: a missing, unreadable or empty one is an Error
  // (INVALID_ARGUMENT) naming the option and the file.
  explicit Credentials(const ClientOptions& options);

  std::shared_ptr<grpc::ChannelCredentials> channel() const { return channel_; }
  void configure(grpc::ChannelArguments& args) const;  // the server-name override, if any
  void authorize(grpc::ClientContext& ctx) const;       // the token, if any
  bool tls() const { return tls_; }
  const std::string& authorization() const { return authorization_; }  // "Bearer <token>", or ""
  // For messages: how the server's certificate is checked ("the CA in FILE" or the system roots).
  std::string trust() const;

 private:
  bool tls_ = false;
  std::string ca_file_, server_name_, authorization_;
  std::shared_ptr<grpc::ChannelCredentials> channel_;
};

// Waits until the channel is connected, for timeout_s at most (a server still starting is waited for).
// A failed TLS handshake (an untrusted or misnamed server certificate) and a server that hangs up in
// every handshake (TLS against plaintext, a refused client certificate) are final: raised at once
// as UNAVAILABLE saying which and naming the CA, rather than retried until the deadline.
void wait_connected(const std::shared_ptr<grpc::Channel>& channel, const Credentials& creds, const std::string& address,
                    double timeout_s);

}  // namespace simbridge
