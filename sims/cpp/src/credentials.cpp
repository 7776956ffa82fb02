// TLS credentials and the token (see credentials.hpp).
#include "credentials.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>

#include <grpcpp/generic/generic_stub.h>

#include "backoff.hpp"

namespace simbridge {

namespace {

Error bad_option(const std::string& option, const std::string& file, const std::string& why) {
  return Error(StatusCode::INVALID_ARGUMENT, "ClientOptions." + option + " '" + file + "': " + why,
               "INVALID_REQUEST");
}

std::string read_file(const std::string& option, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw bad_option(option, path, std::string("cannot read it (") + std::strerror(errno) + ")");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw bad_option(option, path, std::string("cannot read it (") + std::strerror(errno) + ")");
  return text.str();
}

std::string read_pem(const std::string& option, const std::string& path) {
  std::string pem = read_file(option, path);
  // gRPC would take anything and fail later, in a handshake, with no word of which file was wrong.
  if (pem.find("-----BEGIN ") == std::string::npos) throw bad_option(option, path, "not a PEM file (no -----BEGIN line)");
  return pem;
}

std::string stripped(const std::string& s) {
  auto first = std::find_if_not(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c); });
  auto last = std::find_if_not(s.rbegin(), s.rend(), [](unsigned char c) { return std::isspace(c); }).base();
  return first < last ? std::string(first, last) : std::string();
}

// gRPC sends only printable ASCII in a text header; anything else would fail every call with a
// message about metadata, not about the token.
std::string checked_token(const std::string& token, const std::string& source) {
  std::string t = stripped(token);
  if (t.empty()) throw Error(StatusCode::INVALID_ARGUMENT, source + " holds no token (it is empty)", "INVALID_REQUEST");
  for (unsigned char c : t) {
    if (c < 0x20 || c > 0x7e)
      throw Error(StatusCode::INVALID_ARGUMENT,
                  source + " holds a token with a character that is not printable ASCII: a token must be one "
                           "line of printable ASCII",
                  "INVALID_REQUEST");
  }
  return t;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Why the channel failed to connect, as gRPC words it: a call that does not wait for the channel
// fails at once with the last connection error. The call is the standard health check (harmless
// should the channel connect meanwhile); its own answer does not matter.
std::string connect_failure(const std::shared_ptr<grpc::Channel>& channel, const Credentials& creds) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_wait_for_ready(false);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  creds.authorize(ctx);
  grpc::Slice empty;  // an empty HealthCheckRequest: the whole server
  grpc::ByteBuffer request(&empty, 1), response;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status st) {
                   std::lock_guard<std::mutex> lock(mu);
                   status = std::move(st);
                   done = true;
                   cv.notify_one();
                 });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });  // bounded by the call's deadline
  return status.ok() ? std::string() : status.error_message();
}

bool handshake_failed(const std::string& why) {
  std::string w = lower(why);
  for (const char* mark : {"ssl", "certificate", "peer name"})
    if (w.find(mark) != std::string::npos) return true;
  return false;
}

bool closed_by_peer(const std::string& why) {
  std::string w = lower(why);
  return w.find("socket closed") != std::string::npos || w.find("connection reset") != std::string::npos;
}

}  // namespace

const char* const kClientFlagsUsage =
    "  --tls-ca PEM           root certificate(s) that sign the server's: connect over TLS\n"
    "  --tls-cert PEM         this client's certificate, for a server that requires one (with --tls-key)\n"
    "  --tls-key PEM          its private key\n"
    "  --tls-server-name NAME the name to check the server's certificate for, instead of the host dialed\n"
    "  --auth-token-file FILE the server's token (else $SIMBRIDGE_AUTH_TOKEN), sent on every call\n";

bool set_client_flag(ClientOptions& options, const std::string& flag, const std::string& value) {
  if (flag == "--tls-ca") options.tls_ca_file = value;
  else if (flag == "--tls-cert") options.tls_cert_file = value;
  else if (flag == "--tls-key") options.tls_key_file = value;
  else if (flag == "--tls-server-name") options.tls_server_name = value;
  else if (flag == "--auth-token-file") options.auth_token_file = value;
  else return false;
  return true;
}

Credentials::Credentials(const ClientOptions& options)
    : ca_file_(options.tls_ca_file), server_name_(options.tls_server_name) {
  if (options.tls_cert_file.empty() != options.tls_key_file.empty())
    throw Error(StatusCode::INVALID_ARGUMENT,
                "ClientOptions.tls_cert_file and tls_key_file go together (a client certificate and its key): "
                "set both or neither",
                "INVALID_REQUEST");
  tls_ = !options.tls_ca_file.empty() || !options.tls_cert_file.empty() || !options.tls_server_name.empty();
  if (tls_) {
    grpc::SslCredentialsOptions ssl;  // no CA file: the system's roots
    if (!options.tls_ca_file.empty()) ssl.pem_root_certs = read_pem("tls_ca_file", options.tls_ca_file);
    if (!options.tls_cert_file.empty()) {
      ssl.pem_cert_chain = read_pem("tls_cert_file", options.tls_cert_file);
      ssl.pem_private_key = read_pem("tls_key_file", options.tls_key_file);
    }
    channel_ = grpc::SslCredentials(ssl);
  } else {
    channel_ = grpc::InsecureChannelCredentials();
  }
  // The first one set wins: the token itself, its file, the environment.
  std::string token;
  if (!options.auth_token.empty()) {
    token = checked_token(options.auth_token, "ClientOptions.auth_token");
  } else if (!options.auth_token_file.empty()) {
    token = checked_token(read_file("auth_token_file", options.auth_token_file),
                          "ClientOptions.auth_token_file '" + options.auth_token_file + "'");
  } else if (const char* env = std::getenv("SIMBRIDGE_AUTH_TOKEN"); env && *env) {
    token = checked_token(env, "$SIMBRIDGE_AUTH_TOKEN");
  }
  if (!token.empty()) authorization_ = "Bearer " + token;
}

void Credentials::configure(grpc::ChannelArguments& args) const {
  if (!server_name_.empty()) args.SetSslTargetNameOverride(server_name_);
}

void Credentials::authorize(grpc::ClientContext& ctx) const {
  if (!authorization_.empty()) ctx.AddMetadata("authorization", authorization_);
}

std::string Credentials::trust() const {
  return ca_file_.empty() ? std::string("the system's root certificates") : "the CA in " + ca_file_;
}

void wait_connected(const std::shared_ptr<grpc::Channel>& channel, const Credentials& creds, const std::string& address,
                    double timeout_s) {
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  std::string last_failure;
  int hung_up = 0;  // connection attempts in a row that the server accepted, then closed in the handshake
  for (auto state = channel->GetState(true); state != GRPC_CHANNEL_READY; state = channel->GetState(true)) {
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE) {
      last_failure = connect_failure(channel, creds);
      if (creds.tls() && handshake_failed(last_failure))
        throw Error(StatusCode::UNAVAILABLE,
                    "TLS handshake with " + address + " failed (" + last_failure + "): check that " + creds.trust() +
                        " signed the server's certificate, that the certificate names the host you dial (or "
                        "set tls_server_name / --tls-server-name), and that the server serves TLS",
                    "SERVER_UNAVAILABLE");
      // A server that is not up yet refuses the connection; one that takes it and hangs up in the
      // handshake speaks another protocol (TLS against plaintext) or refused this client's
      // certificate: waiting will not change that. Three looks in a row (0.4 s) to be sure.
      hung_up = closed_by_peer(last_failure) ? hung_up + 1 : 0;
      if (hung_up >= 3)
        throw Error(StatusCode::UNAVAILABLE,
                    "the server at " + address + " closed every connection during the handshake (" + last_failure +
                        "): " +
                        (creds.tls() ? "this client speaks TLS (checking the server with " + creds.trust() +
                                           "); the server may require a client certificate signed by a CA it trusts "
                                           "(tls_cert_file and tls_key_file / --tls-cert and --tls-key), or serve "
                                           "plaintext"
                                     : std::string("this client speaks plaintext; the server may serve TLS: give "
                                                   "its CA (tls_ca_file / --tls-ca)")),
                    "SERVER_UNAVAILABLE");
    }
    auto now = std::chrono::system_clock::now();
    if (now >= deadline) {
      std::string how = creds.tls() ? " over TLS (checking its certificate with " + creds.trust() + ")" : "";
      throw Error(StatusCode::UNAVAILABLE,
                  "no simbridge trainer at " + address + how + " within " + fmt_s(timeout_s) +
                      (last_failure.empty() ? "" : " (" + last_failure + ")") +
                      ": start one with `simbridge-trainer run --address " + address +
                      "`, or pass the trainer's address",
                  "SERVER_UNAVAILABLE");
    }
    // gRPC keeps a failing channel in TRANSIENT_FAILURE while it retries: look again every 200 ms.
    channel->WaitForStateChange(state, std::min(deadline, now + std::chrono::milliseconds(200)));
  }
}

}  // namespace simbridge
