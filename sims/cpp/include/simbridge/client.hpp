// simbridge's C++ client SDK: the simulator side of the bridge (proto/simbridge/v1/simbridge.proto).
// This header includes every public one; each holds one concept:
//
//   error.hpp               Error, SessionLost and the SDK's StatusCode
//   space.hpp               Space, rows of floats (Floats) and flatten
//   action.hpp              Action: an action typed leaf by leaf (a Discrete index is an int64)
//   options.hpp             ClientOptions (TLS, token, timeouts, the log callback) and the client flags
//   policy_client.hpp       PolicyClient: one agent per episode
//   multi_agent_client.hpp  MultiAgentPolicyClient: many agents per episode
//   slot_client.hpp         SlotClient: a batched simulator, n slots per Step
//   local_policy.hpp        LocalPolicy: a downloaded policy run in plain C++
//
// Built and installed as a CMake package (sims/cpp/CMakeLists.txt):
//   find_package(simbridge_client CONFIG REQUIRED)
//   target_link_libraries(my_engine PRIVATE simbridge::client)
// No public header includes gRPC or protobuf; they are the library's own dependencies.
//
// Every client holds one bidirectional Stream with numbered requests: when the connection breaks
// it reconnects with backoff, resumes its session and resends what was not answered; the server
// applies each request once. Reconnects, resumes and moves are reported to ClientOptions::log
// (std::cerr by default); what the caller must act on is raised (Error, SessionLost).
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
#pragma once

#include "simbridge/action.hpp"
#include "simbridge/error.hpp"
#include "simbridge/local_policy.hpp"
#include "simbridge/multi_agent_client.hpp"
#include "simbridge/options.hpp"
#include "simbridge/policy_client.hpp"
#include "simbridge/slot_client.hpp"
#include "simbridge/space.hpp"
