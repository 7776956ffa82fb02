// camera_probe --address A --steps T --height H --width W: one episode of a PolicyClient whose
// observation is Dict{camera: Space::Image({H, W, 3}), joints: Box(2)}, for the SDK's end-to-end
// test that an image arrives as its bytes. Step t's pixel i (row-major HWC) is (7 i + 31 t) % 256
// and its joints are (t, -t) / T; T steps, then end_episode with step T's observation. Prints one
// JSON line: steps.
#include <cstdio>
#include <iostream>
#include <string>

#include <simbridge/client.hpp>

namespace {

simbridge::Floats observation(int t, int steps, size_t pixels) {
  simbridge::Floats row(pixels);
  for (size_t i = 0; i < pixels; ++i) row[i] = static_cast<float>((7 * i + 31 * static_cast<size_t>(t)) % 256);
  row.push_back(static_cast<float>(t) / static_cast<float>(steps));
  row.push_back(-static_cast<float>(t) / static_cast<float>(steps));
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  std::string address = "127.0.0.1:50051";
  int steps = 4, height = 6, width = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string name = argv[i];
    if (name == "--address") address = argv[i + 1];
    else if (name == "--steps") steps = std::stoi(argv[i + 1]);
    else if (name == "--height") height = std::stoi(argv[i + 1]);
    else if (name == "--width") width = std::stoi(argv[i + 1]);
  }
  using simbridge::Space;
  try {
    const Space camera = Space::Image({height, width, 3});
    const Space obs = Space::Dict({"camera", "joints"}, {camera, Space::Box({-1, -1}, {1, 1})});
    simbridge::PolicyClient client(address, obs, Space::Discrete(2));
    const std::string eid = client.start_episode();
    for (int t = 0; t < steps; ++t) {
      client.act(eid, observation(t, steps, camera.size()));
      client.log_returns(eid, 1.0);
    }
    client.end_episode(eid, observation(steps, steps, camera.size()));
    client.flush();
    client.close();
    std::printf("{\"steps\": %d}\n", steps);
  } catch (const simbridge::Error& e) {
    std::cerr << "camera_probe: " << e.what() << " (" << e.reason() << ")\n";
    return 1;
  }
  return 0;
}
