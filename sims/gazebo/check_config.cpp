// `simbridge_gz_check_config key=value ...`: parses the plugin's parameters as the plugin would and
// prints the spaces the session would declare. Exit 2 with the reason for a bad parameter. Lets a
// Gazebo user (and tests/sims/test_gazebo_layer.py) check a world's <plugin> block without Gazebo.
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>

#include "episode_logic.hpp"

namespace {
void print_space(const char* name, const simbridge_gz::SpaceSpec& s) {
  std::cout << name << ": ";
  if (s.discrete) {
    std::cout << "Discrete(" << s.n << ")\n";
    return;
  }
  if (!s.image.empty()) {
    std::cout << (s.joints ? "Dict(camera: " : "") << "Image(" << s.image[0] << "x" << s.image[1] << "x" << s.image[2]
              << " uint8)" << (s.joints ? ", joints: " : "\n");
    if (!s.joints) return;
  }
  std::cout << "Box(" << s.low.size() << ") high";
  for (float h : s.high) std::cout << " " << std::setprecision(9) << h;   // a float's every digit
  std::cout << (s.image.empty() ? "\n" : ")\n");
}
}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> params;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::cout << "usage: simbridge_gz_check_config key=value ...\n"
                   "  the simbridge plugin's <plugin> parameters, one key=value each (docs/gazebo.md): prints the\n"
                   "  address the plugin dials ($SIMBRIDGE_ADDRESS included) and the spaces it declares; exit 2\n"
                   "  naming a bad parameter. Keys:";
      for (const auto& key : simbridge_gz::config_keys()) std::cout << " " << key;
      std::cout << "\n";
      return 0;
    }
    const auto eq = arg.find('=');
    if (eq == std::string::npos) {
      std::cerr << "expected key=value, got '" << arg << "'\n";
      return 2;
    }
    params[arg.substr(0, eq)] = arg.substr(eq + 1);
  }
  try {
    const simbridge_gz::Config c = simbridge_gz::parse_config(params, std::getenv("SIMBRIDGE_ADDRESS"));  // as the plugin reads it
    std::cout << "address: " << c.address << "\n";
    print_space("observation", simbridge_gz::observation_space(c));
    print_space("action", simbridge_gz::action_space(c));
  } catch (const std::invalid_argument& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  return 0;
}
