// How a client connects and who it says it is (ClientOptions), where its diagnostics go (the log
// callback), and the command-line flags every simbridge client takes.
#pragma once

#include <functional>
#include <string>

namespace simbridge {

enum class LogLevel { Debug, Info, Warning, Error };
const char* log_level_name(LogLevel level);  // "debug", "info", "warning", "error"

// Receives every diagnostic the SDK writes (a broken connection and its reconnect, a resumed
// session, a move to another host, waiting for a trainer), one message a call, without the
// "simbridge: " prefix or a newline. It is called on the thread that made the client call, while
// the client holds its lock: it must not call back into that client. It must not throw (an
// exception from it is dropped). An engine routes these to its own log (gz-sim's gzmsg/gzerr,
// Unreal's UE_LOG); errors the caller must act on still arrive as exceptions (Error, SessionLost).
using LogCallback = std::function<void(LogLevel level, const std::string& message)>;
// The default: "simbridge: <message>" lines on std::cerr, every level.
void log_to_stderr(LogLevel level, const std::string& message);

struct ClientOptions {
  std::string client_name = "cpp-client";
  double connect_timeout_s = 30, reconnect_timeout_s = 60;
  bool slots_training_enabled = true;  // SlotClient: false keeps its episodes out of training

  // Where the client's diagnostics go; empty: log_to_stderr.
  LogCallback log;

  // TLS (the flags --tls-ca, --tls-cert, --tls-key, --tls-server-name of every simbridge client).
  // Setting any of these four turns TLS on; all empty: a plaintext channel.
  std::string tls_ca_file;      // PEM root certificates that sign the server's; empty: the system's roots
  std::string tls_cert_file;    // PEM client certificate chain, for a server that requires one (mutual TLS)
  std::string tls_key_file;     // its PEM private key (set both or neither)
  std::string tls_server_name;  // the name checked against the server's certificate instead of the host dialed

  // A token for a server started with --auth-token-file, sent on every call as gRPC metadata
  // "authorization: Bearer <token>" (with or without TLS; without it the token crosses the network
  // in clear, so keep plaintext to loopback). The first one set is used: auth_token, the one line
  // of auth_token_file (--auth-token-file; surrounding whitespace stripped), the environment
  // variable SIMBRIDGE_AUTH_TOKEN. A wrong or missing token: Error UNAUTHENTICATED, "AUTH_FAILED".
  std::string auth_token;
  std::string auth_token_file;
};
// The files are read when a client is constructed: one that is missing, unreadable, empty or (for
// the PEM ones) not PEM is an Error INVALID_ARGUMENT naming the option and the file. A failed TLS
// handshake is an Error UNAVAILABLE naming TLS and the CA, raised as soon as the handshake fails
// (not at the end of connect_timeout_s).

// The flags every simbridge client takes for TLS and the token, as the Python clients do:
// --tls-ca, --tls-cert, --tls-key, --tls-server-name, --auth-token-file. If `flag` is one of them,
// sets its option to `value` and returns true; otherwise returns false and changes nothing.
bool set_client_flag(ClientOptions& options, const std::string& flag, const std::string& value);
// Their usage lines, for an engine's --help.
extern const char* const kClientFlagsUsage;

}  // namespace simbridge
