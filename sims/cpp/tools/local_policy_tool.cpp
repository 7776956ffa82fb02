// local_policy_tool POLICY OBSERVATIONS OUT: runs LocalPolicy on observations, for checking the C++
// numbers against simbridge/client/local_policy.py.
//   POLICY: a serialized PortablePolicy (GetPolicyResponse.policy), binary.
//   OBSERVATIONS: text, one observation row per line, values separated by spaces.
//   OUT: JSON {"outputs": [[network output]], "actions": [[action row]], "logp": [...]} (NaN: null).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include <simbridge/client.hpp>

namespace {

void write_row(std::ostream& out, const simbridge::Floats& row) {
  out << "[";
  for (size_t i = 0; i < row.size(); ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(row[i]));
    out << (i ? ", " : "") << buf;
  }
  out << "]";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: " << argv[0] << " POLICY OBSERVATIONS OUT\n";
    return 2;
  }
  std::ifstream policy_file(argv[1], std::ios::binary);
  std::stringstream bytes;
  bytes << policy_file.rdbuf();
  try {
    simbridge::LocalPolicy policy(bytes.str());
    std::ifstream obs_file(argv[2]);
    std::ofstream out(argv[3]);
    std::string line;
    std::stringstream outputs, actions, logps;
    bool first = true;
    while (std::getline(obs_file, line)) {
      std::istringstream fields(line);
      simbridge::Floats row;
      for (float v; fields >> v;) row.push_back(v);
      if (row.empty()) continue;
      const char* sep = first ? "" : ", ";
      first = false;
      outputs << sep;
      if (policy.head_kind() != "random") write_row(outputs, policy.forward(simbridge::flatten(policy.observation_space(), row)));
      else outputs << "[]";
      actions << sep;
      write_row(actions, policy.act(row));
      double logp = policy.last_logp();
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.12g", logp);
      logps << sep << (std::isfinite(logp) ? buf : "null");
    }
    out << "{\"outputs\": [" << outputs.str() << "], \"actions\": [" << actions.str() << "], \"logp\": ["
        << logps.str() << "]}\n";
  } catch (const simbridge::Error& e) {
    std::cerr << "local_policy_tool: " << e.what() << " (" << e.reason() << ")\n";
    return 1;
  }
  return 0;
}
