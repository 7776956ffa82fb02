// N CartPoles on SlotClient: one Step per step for all slots, per-slot auto-reset (an ended slot
// reports its last observation in final_observations and already sends its next episode's first).
// --steps Steps, then a final Step with the last outcome. Prints one JSON line: episodes (ended
// during the run), steps (env steps), steps_per_s, return_mean, cut_short (episodes the final Step
// ended, truncated). --seconds S (bench/throughput.py's cpp_batched*): Steps for --warmup-s, then S
// seconds measured, then the final Step; the JSON line has the window's figures (cartpole::Window),
// printed as the window ends, before that final Step (an error there still exits 1).
// --address takes several ("h1:p1,h2:p2"). SessionLost (a restarted bridge, or a move to another
// address) is handled as the Python simulators do: the message goes to stderr, every CartPole
// resets and the next Step, without an outcome, starts every slot's new episode. "acted_steps" is
// the env steps whose actions came back (what the bridges count); "lost_sessions" the losses.
#include <chrono>
#include <cstdio>
#include <vector>

#include "cartpole_env.hpp"

int main(int argc, char** argv) {
  auto args = cartpole::parse_args(argc, argv, {{"address", "127.0.0.1:50051"}, {"steps", "1000"},
                                                {"slots", "8"}, {"seed", "0"},
                                                {"seconds", "0"}, {"warmup-s", "0"}});
  const long long num_steps = std::stoll(args["steps"]);
  const int n = std::stoi(args["slots"]);
  const uint64_t seed = std::stoull(args["seed"]);
  try {
    simbridge::ClientOptions options = cartpole::client_options(args, "cpp-cartpole-slots");
    simbridge::SlotClient client(args["address"], cartpole::observation_space(), simbridge::Space::Discrete(2), n, options);
    std::vector<cartpole::Env> envs;
    simbridge::Floats obs, rewards(n), finals;
    std::vector<bool> terminated(n), truncated(n);
    std::vector<double> returns(n, 0.0);
    for (int i = 0; i < n; ++i) {
      envs.emplace_back(seed * 1000003 + i);
      auto o = envs[i].reset();
      obs.insert(obs.end(), o.begin(), o.end());
    }
    int episodes = 0, cut_short = 0, lost_sessions = 0;  // cut_short: episodes the final Step ends, truncated
    long long acted = 0;  // env steps whose actions came back
    double return_sum = 0;
    auto t0 = std::chrono::steady_clock::now();
    std::vector<simbridge::Action> actions = client.act(obs);  // Discrete(2): one index per slot
    acted += n;
    cartpole::Window window(std::stod(args["warmup-s"]), std::stod(args["seconds"]));  // warm-up from here
    for (long long t = 0; window.timed() || t < num_steps; ++t) {
      const bool last = window.timed() ? window.over() : t + 1 >= num_steps;
      finals.clear();
      for (int i = 0; i < n; ++i) {
        bool term, trunc;
        auto o = envs[i].step(static_cast<int>(actions[i].index()), &rewards[i], &term, &trunc);
        terminated[i] = term;
        truncated[i] = trunc;
        returns[i] += rewards[i];
        if (term || trunc) {
          finals.insert(finals.end(), o.begin(), o.end());
          return_sum += returns[i];
          window.episode_done(returns[i]);
          returns[i] = 0;
          ++episodes;
          o = envs[i].reset();
        }
        std::copy(o.begin(), o.end(), obs.begin() + 4 * i);
      }
      if (!last) {
        auto call_start = cartpole::Clock::now();
        try {
          actions = client.act(obs, rewards, terminated, truncated, finals);
        } catch (const simbridge::SessionLost& e) {
          // Every slot's episode ended with the old session: new ones from a reset (a second loss
          // here ends the run, exit 1).
          std::fprintf(stderr, "cartpole_slots: %s (%s)\n", e.what(), e.reason().c_str());
          ++lost_sessions;
          for (int i = 0; i < n; ++i) {
            auto o = envs[i].reset();
            std::copy(o.begin(), o.end(), obs.begin() + 4 * i);
            returns[i] = 0;
          }
          actions = client.act(obs);
        }
        acted += n;
        window.step_done(call_start, cartpole::Clock::now(), n);
      } else {
        if (window.timed()) window.print(client.reconnects());  // at once: the bench samples the server's CPU then
        // The last outcome; every slot's last observation (an ended slot's is its final one).
        simbridge::Floats last_obs = obs;
        for (int i = 0, k = 0; i < n; ++i) {
          if (terminated[i] || truncated[i]) {
            std::copy(finals.begin() + 4 * k, finals.begin() + 4 * (k + 1), last_obs.begin() + 4 * i);
            ++k;
          } else {
            ++cut_short;
          }
        }
        client.close(rewards, terminated, truncated, last_obs);
        break;
      }
    }
    if (!window.timed() && num_steps == 0) client.close();
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (window.timed()) return 0;
    std::printf("{\"episodes\": %d, \"steps\": %lld, \"steps_per_s\": %.1f, \"return_mean\": %.3f, \"slots\": %d, \"cut_short\": %d, \"reconnects\": %d, \"acted_steps\": %lld, \"lost_sessions\": %d}\n",
                episodes, num_steps * n, num_steps * n / elapsed, episodes ? return_sum / episodes : 0.0, n, cut_short,
                client.reconnects(), acted, lost_sessions);
  } catch (const simbridge::Error& e) {
    return cartpole::exit_on_error("cartpole_slots", e);
  }
  return 0;
}
