// The unit tests' tiny harness (no test framework in Debian's build deps): each TEST registers
// itself and runs from run_all_tests(); CHECKs that fail are counted, and so is an exception.
#pragma once

#include <exception>
#include <stdexcept>
#include <functional>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

namespace simbridge_test {

inline int failures = 0;
inline std::vector<std::pair<std::string, std::function<void()>>>& registry() {
  static std::vector<std::pair<std::string, std::function<void()>>> tests;
  return tests;
}
struct Register {
  Register(const char* name, std::function<void()> fn) { registry().emplace_back(name, std::move(fn)); }
};

inline int run_all_tests() {
  for (auto& [name, fn] : registry()) {
    int before = failures;
    try {
      fn();
    } catch (const std::exception& e) {
      std::cerr << name << ": unexpected exception: " << e.what() << "\n";
      ++failures;
    }
    std::cout << (failures == before ? "PASS " : "FAIL ") << name << "\n";
  }
  std::cout << registry().size() << " tests, " << failures << " failed checks\n";
  return failures == 0 ? 0 : 1;
}

// The message of the simbridge::Error that fn raises ("<no error>" if none).
template <typename Fn>
std::string error_message(const Fn& fn) {
  try {
    fn();
  } catch (const std::runtime_error& e) {  // simbridge::Error derives from it
    return e.what();
  }
  return "<no error>";
}

}  // namespace simbridge_test

using simbridge_test::error_message;
using simbridge_test::failures;
using simbridge_test::run_all_tests;

#define TEST(name)                                                 \
  void name();                                                     \
  simbridge_test::Register register_##name(#name, name);           \
  void name()
#define CHECK(cond)                                                                              \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      std::cerr << __FILE__ << ":" << __LINE__ << ": CHECK(" #cond ") failed\n";                 \
      ++simbridge_test::failures;                                                                \
    }                                                                                            \
  } while (0)
#define CHECK_THROWS_REASON(expr, want)                                                          \
  do {                                                                                           \
    std::string got_ = "<no error>";                                                             \
    try {                                                                                        \
      expr;                                                                                      \
    } catch (const simbridge::Error& e) {                                                        \
      got_ = e.reason();                                                                         \
    }                                                                                            \
    if (got_ != (want)) {                                                                        \
      std::cerr << __FILE__ << ":" << __LINE__ << ": " #expr " raised " << got_ << ", want " << (want) << "\n"; \
      ++simbridge_test::failures;                                                                \
    }                                                                                            \
  } while (0)
