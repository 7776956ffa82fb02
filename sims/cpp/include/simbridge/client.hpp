// simbridge's C++ client SDK: the simulator side of the bridge (proto/simbridge/v1/simbridge.proto).
//
// One library (simbridge_client), this one header. Every client holds one bidirectional Stream
// with numbered requests: when the connection breaks it reconnects with backoff, resumes its
// session and resends what was not answered; the server applies each request once.
//
// Several bridge hosts: every client takes one address, several in one string with commas
// ("10.0.0.1:50051,10.0.0.2:50051"), or a std::vector<std::string> of them (a bad list: Error
// INVALID_ARGUMENT naming the fix). It connects to one, starting at an index from a hash of the
// host name and process id plus one for each client the process made before (processes spread,
// a process's clients go round), trying each for 0.3 s in turn until connect_timeout_s is spent;
// then an Error naming every address and what was found there. When that host goes away it moves
// to another (at once when nothing listens at the old port any more, after 2 s for a hung host)
// and raises SessionLost: a new session there, the open episodes ended, unanswered requests not
// resent (docs/scaling.md, "Simulators and several bridge hosts").
//
// Addresses: "HOST:PORT" (TCP), "unix:PATH" (gRPC on a Unix socket), and, on Linux,
// "shm+unix:PATH": the session on the Unix socket PATH, every later request and answer through a
// shared-memory ring handed over on PATH.shm (docs/transports.md), resumed and resent as a stream
// is. SIMBRIDGE_SHM_SPIN_US (microseconds) makes a client spin that long for an answer before it
// blocks (off by default: on a small machine the spinning core is the one the bridge needs).
//
// Values travel as rows of floats: one row is the leaves of the space's value concatenated in
// space order (Dict in declared order, Tuple in order), each leaf row-major; a Discrete leaf is one
// value, its index (start included). Batched calls take N rows back to back.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <grpcpp/support/status_code_enum.h>

namespace simbridge {

using Floats = std::vector<float>;

// A failed call: its gRPC status code and the ErrorReason name the server gave (its
// google.rpc.ErrorInfo), e.g. "QUEUE_FULL"; branch on reason(), never on the message.
class Error : public std::runtime_error {
 public:
  Error(grpc::StatusCode code, const std::string& message, std::string reason = "");
  grpc::StatusCode code() const { return code_; }
  std::string reason() const { return reason_; }

 private:
  grpc::StatusCode code_;
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

struct Space {
  enum class Kind { Box, Discrete, MultiDiscrete, MultiBinary, Dict, Tuple };
  Kind kind = Kind::Box;
  Floats low, high;                    // Box: float32 bounds, row-major
  std::vector<int64_t> shape;          // Box, MultiBinary
  int64_t n = 0, start = 0;            // Discrete
  std::vector<int64_t> nvec, starts;   // MultiDiscrete (flat, shape (nvec.size(),))
  std::vector<Space> children;         // Dict (with names) and Tuple
  std::vector<std::string> names;

  static Space Box(Floats low, Floats high);  // 1-D float32 box, shape (low.size(),)
  static Space Box(Floats low, Floats high, std::vector<int64_t> shape);
  static Space Discrete(int64_t n, int64_t start = 0);
  static Space MultiDiscrete(std::vector<int64_t> nvec, std::vector<int64_t> start = {});
  static Space MultiBinary(std::vector<int64_t> shape);
  static Space Dict(std::vector<std::string> names, std::vector<Space> spaces);
  static Space Tuple(std::vector<Space> spaces);

  size_t size() const;       // floats in one row
  size_t flat_size() const;  // features after flatten()
};

// gymnasium.spaces.flatten of one row as float32: Box and MultiBinary as they are, Discrete and
// MultiDiscrete one-hot from their start, Dict and Tuple concatenated in space order.
Floats flatten(const Space& space, const Floats& row);

struct ClientOptions {
  std::string client_name = "cpp-client";
  double connect_timeout_s = 30, reconnect_timeout_s = 60;
  bool slots_training_enabled = true;  // SlotClient: false keeps its episodes out of training

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

class Connection;
class RowCalls;

// ExternalEnv: one agent per episode, on the bidirectional Stream. Calls that return nothing
// (log_action, end_episode) are pipelined: their errors are raised by the next call that reads
// answers. log_returns is queued and travels with the next get_action/log_action/end_episode, so a
// lockstep step is one message each way.
class PolicyClient {
 public:
  // addresses: one, or several with commas ("h1:p1,h2:p2"); or a list.
  PolicyClient(const std::string& addresses, const Space& observation_space, const Space& action_space,
               ClientOptions options = {});
  PolicyClient(const std::vector<std::string>& addresses, const Space& observation_space, const Space& action_space,
               ClientOptions options = {});
  ~PolicyClient();
  PolicyClient(const PolicyClient&) = delete;
  PolicyClient& operator=(const PolicyClient&) = delete;

  std::string start_episode(bool training_enabled = true);
  Floats get_action(const std::string& episode_id, const Floats& observation);  // Box: the action's values; Discrete: one value, the index
  // N episodes in one round trip: N observation rows in, N action rows out.
  Floats get_actions(const std::vector<std::string>& episode_ids, const Floats& observations);
  void log_action(const std::string& episode_id, const Floats& observation, const Floats& action);
  void log_returns(const std::string& episode_id, double reward);
  void end_episode(const std::string& episode_id, const Floats& final_observation, bool truncated = false);
  void flush();  // wait until the server applied every call so far; raise the first error
  void close();

  // The serialized PortablePolicy of the policy serving this session (GetPolicy), for LocalPolicy;
  // empty when the server's version is not newer than known_version.
  std::string get_policy(int64_t known_version = -1);
  std::string session_id() const;
  int64_t last_policy_version() const { return last_policy_version_; }
  int reconnects() const;

 private:
  Space observation_space_, action_space_;
  std::unique_ptr<RowCalls> rows_;
  int64_t last_policy_version_ = -1;
};

using AgentRows = std::map<std::string, Floats>;

// ExternalMultiAgentEnv: many agents per episode, keyed by agent id (RLlib's
// ExternalMultiAgentEnv). Only agents given an observation act; rewards add up per agent until its
// next action. `agents` names agents whose spaces differ from the defaults.
class MultiAgentPolicyClient {
 public:
  MultiAgentPolicyClient(const std::string& addresses, const Space& observation_space, const Space& action_space,
                         ClientOptions options = {},
                         std::map<std::string, std::pair<Space, Space>> agents = {});
  MultiAgentPolicyClient(const std::vector<std::string>& addresses, const Space& observation_space,
                         const Space& action_space, ClientOptions options = {},
                         std::map<std::string, std::pair<Space, Space>> agents = {});
  ~MultiAgentPolicyClient();
  MultiAgentPolicyClient(const MultiAgentPolicyClient&) = delete;
  MultiAgentPolicyClient& operator=(const MultiAgentPolicyClient&) = delete;

  std::string start_episode(bool training_enabled = true);
  AgentRows get_action(const std::string& episode_id, const AgentRows& observations);
  void log_action(const std::string& episode_id, const AgentRows& observations, const AgentRows& actions);
  // terminated/truncated end agents early; final_observations are those agents' last
  // observations (needed for truncated ones). Flags are sent at once, plain rewards are queued.
  void log_returns(const std::string& episode_id, const std::map<std::string, double>& rewards,
                   const std::map<std::string, bool>& terminated = {},
                   const std::map<std::string, bool>& truncated = {}, const AgentRows& final_observations = {});
  void end_episode(const std::string& episode_id, const AgentRows& final_observations = {}, bool truncated = false);
  void flush();
  void close();
  std::string session_id() const;

 private:
  const Space& space_of(const std::string& agent_id, int which) const;
  std::vector<std::vector<std::string>> groups(const std::vector<std::string>& agent_ids) const;
  Space observation_space_, action_space_;
  std::map<std::string, std::pair<Space, Space>> agents_;
  std::unique_ptr<RowCalls> rows_;
};

// A batched simulator: n slots, one Step per step, one message each way (per-slot auto-reset).
class SlotClient {
 public:
  SlotClient(const std::string& addresses, const Space& observation_space, const Space& action_space,
             int num_slots, ClientOptions options = {});
  SlotClient(const std::vector<std::string>& addresses, const Space& observation_space, const Space& action_space,
             int num_slots, ClientOptions options = {});
  ~SlotClient();
  SlotClient(const SlotClient&) = delete;
  SlotClient& operator=(const SlotClient&) = delete;

  // observations: num_slots rows, row-major (num_slots * obs_size); first call: no outcome.
  // Returns num_slots actions, row-major. terminated/truncated one per slot; final_observations
  // rows for the slots that ended (row-major, in slot order), as the proto's StepRequest says.
  Floats step(const Floats& observations, const Floats& rewards = {}, const std::vector<bool>& terminated = {},
              const std::vector<bool>& truncated = {}, const Floats& final_observations = {});
  // Report the last outcome (every slot's last observation; slots not terminated end truncated
  // there) and close. Without an outcome (close()) the last actions' transitions are dropped.
  void close(const Floats& rewards, const std::vector<bool>& terminated, const std::vector<bool>& truncated,
             const Floats& last_observations);
  void close();

  const std::vector<int64_t>& policy_versions() const { return policy_versions_; }
  const std::string& policy_id() const { return policy_id_; }
  std::string session_id() const;
  int reconnects() const;

 private:
  Space observation_space_, action_space_;
  int num_slots_;
  std::unique_ptr<Connection> conn_;
  std::vector<int64_t> policy_versions_;
  std::string policy_id_;
};

// A downloaded PortablePolicy run in plain C++: "flatten" preprocessing, dense layers
// (linear/relu/tanh) and the action head (q_argmax with epsilon and optional action masks,
// tanh_gaussian, random), as simbridge/client/local_policy.py computes it.
class LocalPolicy {
 public:
  explicit LocalPolicy(const std::string& serialized_portable_policy, uint64_t seed = 0);
  ~LocalPolicy();
  LocalPolicy(LocalPolicy&&) noexcept;
  LocalPolicy& operator=(LocalPolicy&&) noexcept;

  // One observation row -> one action row; last_logp() is its log-probability (NaN if unknown).
  Floats act(const Floats& observation);
  double last_logp() const;
  // One flattened observation -> the network's output (Q-values or [mean, log_std]).
  Floats forward(const Floats& flat_observation) const;

  const Space& observation_space() const;
  const Space& action_space() const;
  const std::string& policy_id() const;
  int64_t version() const;
  const std::string& head_kind() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace simbridge
