// An engine's program outside the repository, built against the installed SDK alone
// (find_package(simbridge_client)); tests/sims/test_cpp_package.py copies it out and drives it.
//
//   consumer BRIDGE_ADDRESS DEAD_ADDRESSES
// 1. DEAD_ADDRESSES (two, nothing listens): the SDK says it waits, through the log callback, and
//    raises UNAVAILABLE. 2. Three episodes of five steps on the bridge, actions typed: a Discrete(3)
//    index from act(), the first step's action chosen here and logged as Action::discrete. 3. One
//    more episode, then "READY" and a line on stdin (the test restarts the bridge meanwhile): the
//    next call finds the session gone, SessionLost, the callback having heard why.
// Every log message is printed "LOG <level> <message>"; nothing should reach std::cerr.
#include <cstdio>
#include <iostream>
#include <string>

#include <simbridge/client.hpp>

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  const simbridge::Space obs_space = simbridge::Space::Box({-1, -1}, {1, 1});
  const simbridge::Space act_space = simbridge::Space::Discrete(3);
  simbridge::ClientOptions options;
  options.client_name = "consumer-outside-the-repo";
  options.log = [](simbridge::LogLevel level, const std::string& message) {
    std::printf("LOG %s %s\n", simbridge::log_level_name(level), message.c_str());
    std::fflush(stdout);
  };

  options.connect_timeout_s = 2.5;  // the message comes after one look at each address (0.3 s each), if time is left
  try {
    simbridge::PolicyClient nowhere(argv[2], obs_space, act_space, options);
    return 3;
  } catch (const simbridge::Error& e) {
    std::printf("ERROR %s %s\n", simbridge::status_code_name(e.code()), e.reason().c_str());
  }

  options.connect_timeout_s = 30;
  simbridge::PolicyClient client(argv[1], obs_space, act_space, options);
  int steps = 0;
  for (int episode = 0; episode < 3; ++episode) {
    const std::string id = client.start_episode();
    for (int t = 0; t < 5; ++t, ++steps) {
      const simbridge::Floats obs{0.1f * static_cast<float>(t), -0.1f * static_cast<float>(episode)};
      if (t == 0) {
        client.log_action(id, obs, simbridge::Action::discrete(2));
      } else {
        const int64_t index = client.act(id, obs).index();
        if (index < 0 || index > 2) return 4;
      }
      client.log_returns(id, 1.0);
    }
    client.end_episode(id, {0.0f, 0.0f});
  }
  client.flush();
  std::printf("STEPS %d\n", steps);

  const std::string id = client.start_episode();
  std::printf("READY\n");
  std::fflush(stdout);
  std::string line;
  std::getline(std::cin, line);
  try {
    client.act(id, {0.0f, 0.0f});
    return 5;
  } catch (const simbridge::SessionLost& e) {
    std::printf("SESSIONLOST %s %s\n", simbridge::status_code_name(e.code()), e.reason().c_str());
  }
  client.close();
  return 0;
}
