// inverted_pendulum_test MODEL_XML: the physics layer's own rules (reset noise, clipping, termination,
// truncation, bad models). Agreement with gymnasium's Python env, step for step, is
// tests/sims/test_mujoco_physics.py's job.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>

#include "inverted_pendulum.hpp"

using simbridge::sims::InvertedPendulum;

static int failures = 0;

#define CHECK(cond)                                                      \
  do {                                                                   \
    if (!(cond)) {                                                       \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                        \
    }                                                                    \
  } while (0)

static bool throws_containing(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
  } catch (const std::exception& e) {
    if (std::string(e.what()).find(needle) != std::string::npos) return true;
    std::fprintf(stderr, "threw without '%s': %s\n", needle.c_str(), e.what());
    return false;
  }
  return false;
}

// A linear feedback that holds the pole up for good (gains found on gymnasium's env).
static double balance(const InvertedPendulum::Observation& o) {
  return 0.5 * o[0] + 5.0 * o[1] + 0.5 * o[2] + 1.0 * o[3];
}

static void test_bad_models(const std::string& xml) {
  CHECK(throws_containing([] { InvertedPendulum p("/nonexistent/pendulum.xml", 0); }, "/nonexistent/pendulum.xml"));
  const std::string one_joint = "/tmp/simbridge_mujoco_test_one_joint.xml";
  std::ofstream(one_joint) << "<mujoco><worldbody><body><joint type='hinge'/><geom size='0.1'/></body>"
                              "</worldbody></mujoco>";
  CHECK(throws_containing([&] { InvertedPendulum p(one_joint, 0); }, "not an inverted pendulum"));
  std::remove(one_joint.c_str());
  InvertedPendulum ok(xml, 0);  // and the real one loads
}

static void test_reset_noise(const std::string& xml) {
  InvertedPendulum a(xml, 7), b(xml, 7), c(xml, 8);
  InvertedPendulum::Observation a1 = a.reset(), a2 = a.reset();
  CHECK(a1 == b.reset());  // seeded
  CHECK(a2 == b.reset());
  CHECK(a1 != a2);         // the stream goes on across resets
  CHECK(a1 != c.reset());
  for (double x : a1) CHECK(std::abs(x) <= InvertedPendulum::kResetNoiseScale && x != 0.0);
  CHECK(a.episode_steps() == 0);
}

static void test_action_clipping(const std::string& xml) {
  CHECK(InvertedPendulum(xml, 0).action_low() == -3.0);
  CHECK(InvertedPendulum(xml, 0).action_high() == 3.0);
  const InvertedPendulum::Observation start{0.001, -0.002, 0.003, -0.004};
  auto after = [&](double action) {
    InvertedPendulum p(xml, 0);
    p.reset_to(start);
    return p.step(action).observation;
  };
  CHECK(after(100.0) == after(3.0));
  CHECK(after(-100.0) == after(-3.0));
  CHECK(after(3.0) != after(2.9));
  CHECK(after(1.0)[2] > 0.0);  // a positive action pushes the cart towards +x
}

static void test_termination(const std::string& xml) {
  InvertedPendulum p(xml, 0);
  p.reset_to({0, 0, 0, 0});
  int steps = 0;
  InvertedPendulum::Outcome out{};
  do {
    out = p.step(3.0);  // full push: the pole falls back within a few steps
    ++steps;
    CHECK(out.reward == (out.terminated ? 0.0 : 1.0));
    CHECK(out.terminated == (std::abs(out.observation[1]) > InvertedPendulum::kHealthyAngle));
  } while (!out.terminated && steps < 100);
  CHECK(out.terminated && steps > 1 && steps < 100);
  CHECK(!out.truncated);
  out = p.step(0.0);  // stepping on after the end is allowed, as in gymnasium, and earns nothing
  CHECK(out.terminated && out.reward == 0.0);
}

static void test_truncation(const std::string& xml) {
  InvertedPendulum p(xml, 3);
  InvertedPendulum::Observation obs = p.reset();
  double ret = 0;
  for (int t = 1; t <= InvertedPendulum::kMaxEpisodeSteps; ++t) {
    InvertedPendulum::Outcome out = p.step(balance(obs));
    obs = out.observation;
    ret += out.reward;
    CHECK(!out.terminated);
    CHECK(out.truncated == (t == InvertedPendulum::kMaxEpisodeSteps));
  }
  CHECK(ret == 1000.0);
  obs = p.reset();  // a new episode counts from zero again
  CHECK(p.episode_steps() == 0);
  CHECK(!p.step(balance(obs)).truncated);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s MODEL_XML\n", argv[0]);
    return 2;
  }
  const std::string xml = argv[1];
  test_bad_models(xml);
  test_reset_noise(xml);
  test_action_clipping(xml);
  test_termination(xml);
  test_truncation(xml);
  if (failures) {
    std::fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  std::printf("inverted_pendulum_test: all checks passed\n");
  return 0;
}
