// failover_probe --address A,B [--multi 1]: a PolicyClient (or, with --multi 1, a
// MultiAgentPolicyClient with agents "a" and "b") for the SDK's failover tests. It starts an
// episode and acts once, prints {"ready": true}, and waits for a line on stdin (the test stops the
// server it is on meanwhile). Then: the next get_action must raise SessionLost; a call naming the
// lost episode must be refused (EPISODE_ENDED); a new episode of 10 steps goes to the other server.
// Prints one JSON line: lost (SessionLost's message), lost_s (seconds it took), ended_reason and
// ended (the refusal), steps_after (10).
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include <simbridge/client.hpp>

namespace {
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += c == '"' || c == '\\' ? std::string("\\") + c : std::string(1, c);
  return out + "\"";
}
}  // namespace

int main(int argc, char** argv) {
  std::string address = "127.0.0.1:50051";
  bool multi = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string name = argv[i];
    if (name == "--address") address = argv[i + 1];
    else if (name == "--multi") multi = std::string(argv[i + 1]) == "1";
  }
  using simbridge::Space;
  const Space obs_space = Space::Box({-1, -1}, {1, 1}), act_space = Space::Discrete(2);
  const simbridge::Floats obs = {0.0f, 0.5f};
  simbridge::ClientOptions options;
  options.reconnect_timeout_s = 10;
  try {
    std::unique_ptr<simbridge::PolicyClient> single;
    std::unique_ptr<simbridge::MultiAgentPolicyClient> many;
    if (multi) many = std::make_unique<simbridge::MultiAgentPolicyClient>(address, obs_space, act_space, options);
    else single = std::make_unique<simbridge::PolicyClient>(address, obs_space, act_space, options);
    auto start = [&] { return multi ? many->start_episode() : single->start_episode(); };
    auto act = [&](const std::string& eid) {
      if (multi) many->get_action(eid, {{"a", obs}, {"b", obs}});
      else single->get_action(eid, obs);
    };
    auto reward = [&](const std::string& eid) {
      if (multi) many->log_returns(eid, {{"a", 1.0}, {"b", 1.0}});
      else single->log_returns(eid, 1.0);
    };
    std::string eid = start();
    act(eid);
    reward(eid);
    multi ? many->flush() : single->flush();
    std::printf("{\"ready\": true}\n");
    std::fflush(stdout);
    std::string line;
    std::getline(std::cin, line);

    std::string lost, ended, ended_reason;
    auto t0 = std::chrono::steady_clock::now();
    try {
      act(eid);
    } catch (const simbridge::SessionLost& e) {
      lost = e.what();
    }
    double lost_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    try {
      act(eid);
    } catch (const simbridge::Error& e) {
      ended = e.what();
      ended_reason = e.reason();
    }
    eid = start();
    for (int t = 0; t < 10; ++t) {
      act(eid);
      reward(eid);
    }
    if (multi) many->end_episode(eid, {{"a", obs}, {"b", obs}});
    else single->end_episode(eid, obs);
    multi ? many->flush() : single->flush();
    std::printf("{\"lost\": %s, \"lost_s\": %.4f, \"ended_reason\": %s, \"ended\": %s, \"steps_after\": 10}\n",
                json_string(lost).c_str(), lost_s, json_string(ended_reason).c_str(), json_string(ended).c_str());
  } catch (const simbridge::Error& e) {
    std::fprintf(stderr, "failover_probe: %s (%s)\n", e.what(), e.reason().c_str());
    return 1;
  }
  return 0;
}
