// multiagent_probe --address A --episodes E --steps T: a two-agent game on MultiAgentPolicyClient
// ("a" with the default spaces, "b" with its own), for the SDK's end-to-end tests. Each step both
// agents act, "a" earns 1 and "b" 2; "b" is done (terminated) one step early with its final
// observation; end_episode gives "a"'s. Prints one JSON line: episodes, agent_steps.
#include <cstdio>
#include <iostream>
#include <string>

#include <simbridge/client.hpp>

int main(int argc, char** argv) {
  std::string address = "127.0.0.1:50051";
  int episodes = 2, steps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string name = argv[i];
    if (name == "--address") address = argv[i + 1];
    else if (name == "--episodes") episodes = std::stoi(argv[i + 1]);
    else if (name == "--steps") steps = std::stoi(argv[i + 1]);
  }
  using simbridge::Floats;
  using simbridge::Space;
  try {
    Space obs = Space::Box({-1, -1, -1, -1}, {1, 1, 1, 1}), act = Space::Discrete(2);
    Space b_obs = Space::Dict({"pos", "mode"}, {Space::Box({-1, -1}, {1, 1}), Space::Discrete(3)});
    Space b_act = Space::Box({-1}, {1});
    simbridge::MultiAgentPolicyClient client(address, obs, act, {}, {{"b", {b_obs, b_act}}});
    long long agent_steps = 0;
    for (int e = 0; e < episodes; ++e) {
      std::string eid = client.start_episode();
      for (int t = 0; t < steps; ++t) {
        float x = 0.1f * static_cast<float>(t % 10);
        simbridge::AgentRows observations{{"a", {x, -x, 0, 0}}};
        bool b_acts = t < steps - 1;
        if (b_acts) observations["b"] = {x, x, static_cast<float>(t % 3)};
        // Typed: "a"'s Discrete(2) action is an index, "b"'s Box(1) action one float.
        simbridge::AgentActions actions = client.act(eid, observations);
        const int64_t a = actions.at("a").index();
        if (a < 0 || a > 1 || (b_acts && actions.at("b").floats().size() != 1)) throw std::runtime_error("bad actions");
        if (b_acts && (actions.at("b").floats()[0] < -1 || actions.at("b").floats()[0] > 1))
          throw std::runtime_error("b out of its box");
        agent_steps += static_cast<long long>(observations.size());
        if (b_acts && t == steps - 2) {
          client.log_returns(eid, {{"a", 1.0}, {"b", 2.0}}, {{"b", true}}, {}, {{"b", {x, x, 1}}});
        } else {
          client.log_returns(eid, b_acts ? std::map<std::string, double>{{"a", 1.0}, {"b", 2.0}}
                                         : std::map<std::string, double>{{"a", 1.0}});
        }
      }
      client.end_episode(eid, {{"a", {0, 0, 0, 0}}});
    }
    client.flush();
    client.close();
    std::printf("{\"episodes\": %d, \"agent_steps\": %lld}\n", episodes, agent_steps);
  } catch (const simbridge::Error& e) {
    std::cerr << "multiagent_probe: " << e.what() << " (" << e.reason() << ")\n";
    return 1;
  }
  return 0;
}
