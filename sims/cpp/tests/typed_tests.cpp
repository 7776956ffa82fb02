// Unit tests of what the public headers promise beside rows of floats: Actions typed leaf by leaf
// (to and from rows, and on the wire without passing through float), the SDK's own status codes,
// and the log callback's guard. Linked into simbridge_unit_tests.
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <google/protobuf/util/message_differencer.h>

#include "harness.hpp"
#include "log.hpp"
#include "wire.hpp"

using namespace simbridge;

namespace {

Space mixed() {  // Dict{d: Discrete(3, start 1), b: Box(2), m: MultiDiscrete([2, 4]), t: Tuple(MultiBinary(2))}
  return Space::Dict({"d", "b", "m", "t"}, {Space::Discrete(3, 1), Space::Box({-1, -1}, {1, 1}),
                                              Space::MultiDiscrete({2, 4}), Space::Tuple({Space::MultiBinary({2})})});
}

TEST(a_discrete_action_is_its_index_and_nothing_else_is) {
  CHECK(Action::discrete(7).index() == 7);
  CHECK(to_action(Space::Discrete(4, 2), {5.0f}).index() == 5);
  CHECK(to_row(Space::Discrete(4, 2), Action::discrete(5)) == Floats({5.0f}));
  CHECK_THROWS_REASON(Action::box({0.5f}).index(), "INVALID_VALUE");
  CHECK_THROWS_REASON(Action::of({1, 2}, {}).index(), "INVALID_VALUE");
  CHECK_THROWS_REASON(to_action(Space::Discrete(4), {1.5f}), "INVALID_VALUE");   // not an integer
  CHECK_THROWS_REASON(to_row(Space::Discrete(4), Action::box({1.0f})), "INVALID_VALUE");
}

TEST(rows_and_actions_convert_both_ways_leaf_by_leaf) {
  const Space s = mixed();
  CHECK(s.size() == 7 && s.int_size() == 5);
  const Floats row{3, 0.25f, -0.5f, 1, 3, 0, 1};
  const Action a = to_action(s, row);
  CHECK(a.ints() == Ints({3, 1, 3, 0, 1}) && a.floats() == Floats({0.25f, -0.5f}));
  CHECK(to_row(s, a) == row);
  std::vector<Action> two = to_actions(Space::Discrete(2), {1, 0}, 2);
  CHECK(two.size() == 2 && two[0].index() == 1 && two[1].index() == 0);
}

TEST(typed_actions_cross_the_wire_as_integer_tensors_exactly) {
  // 2^40 + 1 has no float32: only the typed path keeps it.
  const Space big = Space::MultiDiscrete({int64_t{1} << 41});
  const Action exact = Action::of({(int64_t{1} << 40) + 1}, {});
  pb::Value v;
  fill_actions(&v, big, {&exact}, "a");
  CHECK(v.tensor().dtype() == pb::INT64 && v.tensor().shape_size() == 2);
  CHECK(decode_actions(big, v, 1, "a")[0] == exact);

  const Space s = mixed();
  const Action a = to_action(s, {3, 0.25f, -0.5f, 1, 3, 0, 1}), b = to_action(s, {1, 1, 1, 0, 0, 1, 1});
  pb::Value both;
  fill_actions(&both, s, {&a, &b}, "actions");
  // The same Value as the rows' path makes, so the two APIs can be mixed on one session.
  pb::Value rows;
  Floats flat = to_row(s, a);
  for (float f : to_row(s, b)) flat.push_back(f);
  fill_value(&rows, s, flat.data(), 2, "actions");
  CHECK(google::protobuf::util::MessageDifferencer::Equals(both, rows));
  std::vector<Action> back = decode_actions(s, both, 2, "actions");
  CHECK(back.size() == 2 && back[0] == a && back[1] == b);
  CHECK(decode_value(s, both, 2, "actions") == flat);
  CHECK_THROWS_REASON(fill_actions(&both, s, {&exact}, "actions"), "INVALID_VALUE");   // sizes checked first
}

TEST(status_codes_are_the_sdks_own_with_the_canonical_numbers) {
  CHECK(static_cast<int>(StatusCode::UNAVAILABLE) == 14 && static_cast<int>(StatusCode::UNAUTHENTICATED) == 16);
  CHECK(std::string(status_code_name(StatusCode::PERMISSION_DENIED)) == "PERMISSION_DENIED");
  CHECK(std::string(status_code_name(static_cast<StatusCode>(99))) == "UNKNOWN");
  CHECK(from_grpc(grpc::StatusCode::DEADLINE_EXCEEDED) == StatusCode::DEADLINE_EXCEEDED);
  CHECK(error_from_grpc(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "no")).code() == StatusCode::UNAUTHENTICATED);
}

TEST(the_log_callback_gets_level_and_message_and_cannot_break_the_caller) {
  std::vector<std::pair<LogLevel, std::string>> got;
  LogCallback log = [&got](LogLevel level, const std::string& message) { got.emplace_back(level, message); };
  emit(log, LogLevel::Warning, "connection broke");
  CHECK(got.size() == 1 && got[0].first == LogLevel::Warning && got[0].second == "connection broke");
  emit([](LogLevel, const std::string&) { throw std::runtime_error("a bad sink"); }, LogLevel::Error, "x");  // dropped
  CHECK(std::string(log_level_name(LogLevel::Info)) == "info");
}

}  // namespace
