// pendulum_trace MODEL_XML < input
//
// Replays a trajectory on the C++ InvertedPendulum so it can be compared with gymnasium's.
// Input (whitespace separated): the initial state (qpos then qvel, 4 numbers), then one action per step.
// Output: a line with the initial observation, then one line per action:
//   obs0 obs1 obs2 obs3 reward terminated truncated
// with every double at full precision (%.17g), so nothing is lost between the languages.
#include <cstdio>
#include <exception>
#include <iostream>

#include "inverted_pendulum.hpp"

using simbridge::sims::InvertedPendulum;

static void print_observation(const InvertedPendulum::Observation& obs) {
  for (int i = 0; i < InvertedPendulum::kObservationSize; ++i) std::printf(i ? " %.17g" : "%.17g", obs[i]);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s MODEL_XML < initial_state_and_actions\n", argv[0]);
    return 2;
  }
  try {
    InvertedPendulum pendulum(argv[1], 0);
    InvertedPendulum::Observation state{};
    for (double& x : state) {
      if (!(std::cin >> x)) {
        std::fprintf(stderr, "pendulum_trace: expected %d numbers for the initial state\n",
                     InvertedPendulum::kObservationSize);
        return 2;
      }
    }
    print_observation(pendulum.reset_to(state));
    std::printf("\n");
    double action;
    while (std::cin >> action) {
      InvertedPendulum::Outcome out = pendulum.step(action);
      print_observation(out.observation);
      std::printf(" %.17g %d %d\n", out.reward, out.terminated ? 1 : 0, out.truncated ? 1 : 0);
    }
    if (!std::cin.eof()) {
      std::fprintf(stderr, "pendulum_trace: an action is not a number\n");
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pendulum_trace: %s\n", e.what());
    return 1;
  }
  return 0;
}
