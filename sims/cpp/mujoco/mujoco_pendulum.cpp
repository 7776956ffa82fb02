// mujoco_pendulum_sim: a C++ simulator that owns its loop. It steps gymnasium's InvertedPendulum-v5
// physics with MuJoCo's C API and asks the trainer for every action through the C++ SDK's
// PolicyClient (ExternalEnv semantics), reporting rewards and episode ends.
//
//   simbridge-trainer run --config sims/cpp/mujoco/pendulum_sac.toml
//   mujoco_pendulum_sim --address 127.0.0.1:50051 --seed 0 --max-steps 20000
//
// Prints one JSON line at exit: env steps, episodes, returns, why it stopped. SIGTERM or SIGINT
// stop it after the current step (the episode under way ends as truncated); a second one exits at once.
// --address takes several ("h1:p1,h2:p2"); a lost session (a restarted trainer, or a move to another
// address) ends the episode under way and the next starts on the new session ("lost_sessions").
#include <simbridge/client.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "inverted_pendulum.hpp"

using simbridge::sims::InvertedPendulum;

namespace {

volatile std::sig_atomic_t stop_signal = 0;

void on_signal(int sig) {
  if (stop_signal) std::_Exit(128 + sig);
  stop_signal = sig;
}

struct Options {
  std::string address = "127.0.0.1:50051";
  uint64_t seed = 0;
  long long max_steps = 0;  // 0: until a signal
  std::string model;
  simbridge::ClientOptions client;  // the TLS and token flags
};

const char* kUsage =
    "usage: mujoco_pendulum_sim [--address HOST:PORT] [--seed N] [--max-steps N] [--model PATH]\n"
    "                           [--tls-ca PEM [--tls-cert PEM --tls-key PEM] [--tls-server-name NAME]]\n"
    "                           [--auth-token-file FILE]\n"
    "  --address    the trainer's bridge (default 127.0.0.1:50051)\n"
    "  --seed       seeds the reset noise (default 0)\n"
    "  --max-steps  stop after this many env steps (default 0: until SIGTERM/SIGINT)\n"
    "  --model      gymnasium's inverted_pendulum.xml (default: the one CMake found)\n";

[[noreturn]] void usage_error(const std::string& why) {
  std::fprintf(stderr, "mujoco_pendulum_sim: %s\n%s%s", why.c_str(), kUsage, simbridge::kClientFlagsUsage);
  std::exit(2);
}

long long parse_count(const std::string& flag, const std::string& text) {
  try {
    size_t used = 0;
    long long value = std::stoll(text, &used);
    if (used == text.size() && value >= 0) return value;
  } catch (const std::exception&) {
  }
  usage_error(flag + " wants a non-negative integer, got '" + text + "'");
}

Options parse_options(int argc, char** argv) {
  Options o;
#ifdef SIMBRIDGE_DEFAULT_PENDULUM_XML
  o.model = SIMBRIDGE_DEFAULT_PENDULUM_XML;
#endif
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      std::fputs(kUsage, stdout);
      std::fputs(simbridge::kClientFlagsUsage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) usage_error("unknown option or missing value: " + flag);
    std::string value = argv[++i];
    if (flag == "--address") o.address = value;
    else if (flag == "--seed") o.seed = static_cast<uint64_t>(parse_count(flag, value));
    else if (flag == "--max-steps") o.max_steps = parse_count(flag, value);
    else if (flag == "--model") o.model = value;
    else if (!simbridge::set_client_flag(o.client, flag, value)) usage_error("unknown option: " + flag);
  }
  if (o.model.empty()) usage_error("--model is required (CMake found no gymnasium inverted_pendulum.xml)");
  return o;
}

simbridge::Floats to_floats(const InvertedPendulum::Observation& obs) {
  return simbridge::Floats(obs.begin(), obs.end());
}

struct Summary {
  long long env_steps = 0;
  std::vector<double> returns;  // episodes that ended by themselves (terminated or the 1000-step limit)
  long long cut_episodes = 0;   // ended early by --max-steps, a signal or a lost session
  long long lost_sessions = 0;  // SessionLost: a restarted bridge, or a move to another address
  std::string stopped = "max_steps";
  std::string error;

  void print(double wall_s) const {
    auto mean_last = [&](size_t n) {
      n = std::min(n, returns.size());
      return n ? std::accumulate(returns.end() - n, returns.end(), 0.0) / n : 0.0;
    };
    double best = returns.empty() ? 0.0 : *std::max_element(returns.begin(), returns.end());
    std::printf("{\"env_steps\": %lld, \"episodes\": %zu, \"cut_episodes\": %lld, \"mean_return\": %.6g, "
                "\"mean_return_last_10\": %.6g, \"best_return\": %.6g, \"lost_sessions\": %lld, \"stopped\": \"%s\", "
                "\"wall_s\": %.3f",
                env_steps, returns.size(), cut_episodes, mean_last(returns.size()), mean_last(10), best,
                lost_sessions, stopped.c_str(), wall_s);
    if (!error.empty()) {
      std::string escaped;
      for (char c : error) {
        if (c == '"' || c == '\\') escaped += '\\';
        escaped += (c == '\n' || c == '\r' || c == '\t') ? ' ' : c;
      }
      std::printf(", \"error\": \"%s\"", escaped.c_str());
    }
    std::printf("}\n");
    std::fflush(stdout);
  }
};

// Episodes until the step budget or a signal. Returns normally; SDK and MuJoCo errors propagate.
void run(const Options& o, Summary& summary) {
  InvertedPendulum pendulum(o.model, o.seed);
  const float inf = std::numeric_limits<float>::infinity();
  simbridge::ClientOptions client_options = o.client;
  client_options.client_name = "mujoco-pendulum";
  simbridge::PolicyClient client(
      o.address, simbridge::Space::Box(simbridge::Floats(InvertedPendulum::kObservationSize, -inf),
                                       simbridge::Floats(InvertedPendulum::kObservationSize, inf)),
      simbridge::Space::Box({static_cast<float>(pendulum.action_low())}, {static_cast<float>(pendulum.action_high())}),
      client_options);
  auto out_of_budget = [&] { return o.max_steps > 0 && summary.env_steps >= o.max_steps; };
  long long steps_at_last_loss = -1;
  while (!stop_signal && !out_of_budget()) {
    InvertedPendulum::Observation obs = pendulum.reset();
    double episode_return = 0;
    try {
      std::string episode = client.start_episode();
      for (;;) {
        simbridge::Floats action = client.get_action(episode, to_floats(obs));
        if (action.size() != 1) {
          throw std::runtime_error("the trainer sent " + std::to_string(action.size()) + " action values, want 1");
        }
        InvertedPendulum::Outcome out = pendulum.step(action[0]);
        ++summary.env_steps;
        episode_return += out.reward;
        client.log_returns(episode, out.reward);
        bool natural_end = out.terminated || out.truncated;
        if (natural_end || stop_signal || out_of_budget()) {
          // An episode cut short here ends like a time limit: truncated, so learners bootstrap from it;
          // `stopping` keeps it out of the returns (the policy did not end it).
          client.end_episode(episode, to_floats(out.observation), !out.terminated, !natural_end);
          if (natural_end) summary.returns.push_back(episode_return);
          else ++summary.cut_episodes;
          break;
        }
        obs = out.observation;
      }
    } catch (const simbridge::SessionLost& e) {
      // The bridge restarted, or the client moved to another of its addresses: the episode ended
      // with the old session. Go on with a new one, as the Python simulators do; a second loss
      // before any step in between ends the run.
      if (steps_at_last_loss == summary.env_steps) throw;
      steps_at_last_loss = summary.env_steps;
      std::fprintf(stderr, "mujoco_pendulum_sim: %s (%s)\n", e.what(), e.reason().c_str());
      ++summary.lost_sessions;
      ++summary.cut_episodes;
    }
  }
  if (stop_signal) summary.stopped = stop_signal == SIGINT ? "sigint" : "sigterm";
  client.close();
}

}  // namespace

int main(int argc, char** argv) {
  Options options = parse_options(argc, argv);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  auto start = std::chrono::steady_clock::now();
  Summary summary;
  int rc = 0;
  try {
    run(options, summary);
  } catch (const simbridge::Error& e) {
    if (e.reason() == "TRAINING_OVER") {
      summary.stopped = "training_over";  // the trainer's run is done: a normal end
    } else {
      summary.stopped = "error";
      summary.error = std::string(e.what()) + " (reason " + e.reason() + ", gRPC status " +
                      std::to_string(static_cast<int>(e.code())) + ")";
      rc = 1;
    }
  } catch (const std::exception& e) {
    summary.stopped = "error";
    summary.error = e.what();
    rc = 1;
  }
  if (rc) std::fprintf(stderr, "mujoco_pendulum_sim: %s\n", summary.error.c_str());
  summary.print(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return rc;
}
