// One value of a space typed leaf by leaf: the integer leaves (Discrete, MultiDiscrete,
// MultiBinary) as int64, the Box leaves as float32. A Discrete action is its index, an integer,
// not a float that happens to hold one: exact for any index, and no cast at the call site.
//
// The clients take and return these beside rows of floats (space.hpp); both travel the same way on
// the wire, so the two can be mixed in one session.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "simbridge/space.hpp"

namespace simbridge {

class Action {
 public:
  Action() = default;
  // Discrete: the index (start included).
  static Action discrete(int64_t index);
  // Box: its values, row-major.
  static Action box(Floats values);
  // Any space: its integer leaves' values and its Box leaves' values, each in space order.
  static Action of(Ints ints, Floats floats);

  // The one integer of a Discrete action; Error INVALID_ARGUMENT when this is not one integer alone.
  int64_t index() const;
  const Ints& ints() const { return ints_; }
  const Floats& floats() const { return floats_; }
  bool operator==(const Action& other) const { return ints_ == other.ints_ && floats_ == other.floats_; }
  bool operator!=(const Action& other) const { return !(*this == other); }

 private:
  Action(Ints ints, Floats floats) : ints_(std::move(ints)), floats_(std::move(floats)) {}
  Ints ints_;
  Floats floats_;
};

// A row of floats <-> an Action of `space`. Error INVALID_ARGUMENT (reason INVALID_VALUE) when the
// sizes do not fit the space, or an integer leaf's float is not an integer.
Action to_action(const Space& space, const Floats& row);
Floats to_row(const Space& space, const Action& action);
// n rows back to back -> n Actions.
std::vector<Action> to_actions(const Space& space, const Floats& rows, size_t n);

}  // namespace simbridge
