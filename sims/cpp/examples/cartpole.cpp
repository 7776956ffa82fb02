// CartPole on PolicyClient, lockstep: each step is one get_action round trip carrying the previous
// step's reward. --slots K keeps K CartPoles (K episodes open) stepped in turn on one client.
// --inference local: the actions come from the downloaded policy (GetPolicy, LocalPolicy) and are
// reported with log_action instead. Prints one JSON line: episodes, steps, steps_per_s, return_mean.
// --seconds S (bench/throughput.py's cpp_lockstep): episodes without end for --warmup-s, then S
// seconds measured; the JSON line has the window's figures only (cartpole::Window), printed as the
// window ends, before the flush and close (an error there still exits 1).
// --address takes several ("h1:p1,h2:p2"). SessionLost (a restarted bridge, or a move to another
// address) is handled as the Python simulators do: the message goes to stderr and every CartPole
// starts a new episode (the open ones ended with the old session); "lost_sessions" counts them.
#include <chrono>
#include <cstdio>
#include <memory>
#include <vector>

#include "cartpole_env.hpp"

int main(int argc, char** argv) {
  auto args = cartpole::parse_args(argc, argv, {{"address", "127.0.0.1:50051"}, {"episodes", "10"},
                                                {"slots", "1"}, {"seed", "0"}, {"inference", "remote"},
                                                {"seconds", "0"}, {"warmup-s", "0"}});
  const int episodes = std::stoi(args["episodes"]), slots = std::stoi(args["slots"]);
  const uint64_t seed = std::stoull(args["seed"]);
  const bool endless = std::stod(args["seconds"]) > 0;  // timed: each ended episode is followed by a new one
  try {
    simbridge::ClientOptions options = cartpole::client_options(args, "cpp-cartpole");
    simbridge::PolicyClient client(args["address"], cartpole::observation_space(), simbridge::Space::Discrete(2), options);
    std::unique_ptr<simbridge::LocalPolicy> local;
    if (args["inference"] == "local") local = std::make_unique<simbridge::LocalPolicy>(client.get_policy(), seed);
    std::vector<cartpole::Env> envs;
    std::vector<simbridge::Floats> obs(slots);
    std::vector<std::string> ids(slots);
    std::vector<double> returns(slots, 0.0);
    std::vector<bool> running(slots, false);
    int started = 0, finished = 0, lost_sessions = 0;
    long long steps = 0;
    double return_sum = 0;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < slots; ++i) {
      envs.emplace_back(seed * 1000003 + i);
      if (endless || started < episodes) {
        obs[i] = envs[i].reset();
        ids[i] = client.start_episode();
        running[i] = true;
        ++started;
      }
    }
    // The session was lost: its open episodes ended with it; each running CartPole starts anew.
    auto start_over = [&](const simbridge::SessionLost& e) {
      std::fprintf(stderr, "cartpole: %s (%s)\n", e.what(), e.reason().c_str());
      ++lost_sessions;
      for (int i = 0; i < slots; ++i) {
        if (!running[i]) continue;
        obs[i] = envs[i].reset();
        returns[i] = 0;
        ids[i] = client.start_episode();
      }
    };
    cartpole::Window window(std::stod(args["warmup-s"]), std::stod(args["seconds"]));  // warm-up from here
    while (endless ? !window.over() : finished < episodes) {
      for (int i = 0; i < slots; ++i) {
        if (!running[i]) continue;
        try {
          auto call_start = cartpole::Clock::now();
          int action;
          if (local) {
            action = static_cast<int>(local->act_typed(obs[i]).index());
            client.log_action(ids[i], obs[i], simbridge::Action::discrete(action));
          } else {
            action = static_cast<int>(client.act(ids[i], obs[i]).index());  // Discrete(2): an index
          }
          auto call_end = cartpole::Clock::now();
          float reward;
          bool terminated, truncated;
          obs[i] = envs[i].step(action, &reward, &terminated, &truncated);
          client.log_returns(ids[i], reward);
          returns[i] += reward;
          ++steps;
          if (terminated || truncated) {
            client.end_episode(ids[i], obs[i], truncated);
            window.episode_done(returns[i]);
            return_sum += returns[i];
            returns[i] = 0;
            ++finished;
            running[i] = endless || started < episodes;
            if (running[i]) {
              obs[i] = envs[i].reset();
              ids[i] = client.start_episode();
              ++started;
            }
          }
          window.step_done(call_start, call_end, 1);
        } catch (const simbridge::SessionLost& e) {
          start_over(e);  // a second loss while starting over ends the run (exit 1)
        }
      }
    }
    if (window.timed()) window.print(client.reconnects());  // at once: the bench samples the server's CPU then
    try {
      client.flush();
    } catch (const simbridge::SessionLost& e) {
      std::fprintf(stderr, "cartpole: %s (%s)\n", e.what(), e.reason().c_str());  // nothing left to report: the episodes are done
      ++lost_sessions;
    }
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    client.close();
    if (window.timed()) return 0;
    std::printf("{\"episodes\": %d, \"steps\": %lld, \"steps_per_s\": %.1f, \"return_mean\": %.3f, \"reconnects\": %d, \"policy_version\": %lld, \"lost_sessions\": %d}\n",
                finished, steps, steps / elapsed, finished ? return_sum / finished : 0.0, client.reconnects(),
                static_cast<long long>(local ? local->version() : client.last_policy_version()), lost_sessions);
  } catch (const simbridge::Error& e) {
    return cartpole::exit_on_error("cartpole", e);
  }
  return 0;
}
