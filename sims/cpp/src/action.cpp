// Actions typed leaf by leaf (see simbridge/action.hpp), and their wire form: integer leaves go
// from int64 to the wire's integer tensors and back without passing through float.
#include <cmath>
#include <cstring>

#include "wire.hpp"

namespace simbridge {

namespace {

bool integral(const Space& s) {
  return s.kind == Space::Kind::Discrete || s.kind == Space::Kind::MultiDiscrete || s.kind == Space::Kind::MultiBinary;
}

// Calls fn(leaf) for each Box/Discrete/MultiDiscrete/MultiBinary leaf of s, in space order.
template <typename Fn>
void for_each_leaf(const Space& s, Fn&& fn) {
  if (s.kind == Space::Kind::Dict || s.kind == Space::Kind::Tuple) {
    for (const auto& c : s.children) for_each_leaf(c, fn);
    return;
  }
  fn(s);
}

void check_action(const Space& space, const Action& a, const std::string& what) {
  const size_t ints = space.int_size(), floats = space.size() - ints;
  if (a.ints().size() != ints || a.floats().size() != floats)
    throw invalid_value(what + ": this space's action has " + std::to_string(ints) + " integer and " +
                        std::to_string(floats) + " float values, got " + std::to_string(a.ints().size()) + " and " +
                        std::to_string(a.floats().size()));
}

// The leaf's n rows, from each action's cursor on (advanced by the leaf's size).
template <typename T, typename Src>
std::vector<T> column(const std::vector<const Src*>& rows, size_t k, size_t offset) {
  std::vector<T> out(rows.size() * k);
  for (size_t r = 0; r < rows.size(); ++r)
    for (size_t j = 0; j < k; ++j) out[r * k + j] = static_cast<T>((*rows[r])[offset + j]);
  return out;
}

struct Cursor {
  size_t ints = 0, floats = 0;
};

void fill_typed(pb::Value* value, const Space& s, const std::vector<const Action*>& acts, Cursor& at,
                const std::string& what) {
  const size_t n = acts.size(), k = s.size();
  std::vector<int64_t> shape{static_cast<int64_t>(n)};
  std::vector<const Ints*> ints;
  std::vector<const Floats*> floats;
  for (const Action* a : acts) {
    ints.push_back(&a->ints());
    floats.push_back(&a->floats());
  }
  switch (s.kind) {
    case Space::Kind::Box: {
      shape.insert(shape.end(), s.shape.begin(), s.shape.end());
      fill_box_tensor(value->mutable_tensor(), s, column<float>(floats, k, at.floats), shape, what);
      at.floats += k;
      return;
    }
    case Space::Kind::Discrete: case Space::Kind::MultiDiscrete: {
      if (s.kind == Space::Kind::MultiDiscrete) shape.push_back(static_cast<int64_t>(k));
      auto leaf = column<int64_t>(ints, k, at.ints);
      fill_tensor(value->mutable_tensor(), pb::INT64, leaf.data(), leaf.size() * 8, shape);
      at.ints += k;
      return;
    }
    case Space::Kind::MultiBinary: {
      shape.insert(shape.end(), s.shape.begin(), s.shape.end());
      auto leaf = column<int8_t>(ints, k, at.ints);
      fill_tensor(value->mutable_tensor(), pb::INT8, leaf.data(), leaf.size(), shape);
      at.ints += k;
      return;
    }
    case Space::Kind::Dict: {
      auto* items = value->mutable_dict()->mutable_items();
      for (size_t i = 0; i < s.children.size(); ++i)
        fill_typed(&(*items)[s.names[i]], s.children[i], acts, at, what + "." + s.names[i]);
      return;
    }
    case Space::Kind::Tuple:
      for (const auto& c : s.children) fill_typed(value->mutable_tuple()->add_items(), c, acts, at, what);
      return;
  }
}

void decode_typed(const Space& s, const pb::Value& value, std::vector<Action>& out, std::vector<Ints>& ints,
                  std::vector<Floats>& floats, const std::string& what) {
  const size_t n = out.size();
  if (s.kind == Space::Kind::Dict) {
    if (!value.has_dict()) throw invalid_value(what + ": expected a dict value");
    for (size_t i = 0; i < s.children.size(); ++i) {
      auto it = value.dict().items().find(s.names[i]);
      if (it == value.dict().items().end()) throw invalid_value(what + ": key " + s.names[i] + " is missing");
      decode_typed(s.children[i], it->second, out, ints, floats, what + "." + s.names[i]);
    }
    return;
  }
  if (s.kind == Space::Kind::Tuple) {
    if (!value.has_tuple() || value.tuple().items_size() != static_cast<int>(s.children.size()))
      throw invalid_value(what + ": expected a tuple of " + std::to_string(s.children.size()) + " values");
    for (size_t i = 0; i < s.children.size(); ++i)
      decode_typed(s.children[i], value.tuple().items(static_cast<int>(i)), out, ints, floats, what);
    return;
  }
  if (!value.has_tensor()) throw invalid_value(what + ": expected a tensor");
  const auto& t = value.tensor();
  const size_t k = s.size();
  auto check = [&](size_t got) {
    if (got != n * k || t.shape_size() == 0 || t.shape(0) != static_cast<int64_t>(n))
      throw invalid_value(what + ": expected " + std::to_string(n) + " rows of " + std::to_string(k) + " values");
  };
  if (integral(s)) {
    Ints leaf = tensor_ints(t, what);
    check(leaf.size());
    for (size_t r = 0; r < n; ++r) ints[r].insert(ints[r].end(), leaf.begin() + r * k, leaf.begin() + (r + 1) * k);
  } else {
    Floats leaf = tensor_floats(t, what);
    check(leaf.size());
    for (size_t r = 0; r < n; ++r)
      floats[r].insert(floats[r].end(), leaf.begin() + r * k, leaf.begin() + (r + 1) * k);
  }
}

}  // namespace

// ---------------------------------------------------------------- Action

Action Action::discrete(int64_t index) { return Action({index}, {}); }
Action Action::box(Floats values) { return Action({}, std::move(values)); }
Action Action::of(Ints ints, Floats floats) { return Action(std::move(ints), std::move(floats)); }

int64_t Action::index() const {
  if (ints_.size() != 1 || !floats_.empty())
    throw invalid_value("Action::index: a Discrete action is one integer; this one has " + std::to_string(ints_.size()) +
                        " integers and " + std::to_string(floats_.size()) + " floats");
  return ints_[0];
}

size_t Space::int_size() const {
  size_t n = 0;
  for_each_leaf(*this, [&n](const Space& leaf) { n += integral(leaf) ? leaf.size() : 0; });
  return n;
}

Action to_action(const Space& space, const Floats& row) {
  if (row.size() != space.size())
    throw invalid_value("to_action: a row of this space has " + std::to_string(space.size()) + " values, got " +
                        std::to_string(row.size()));
  Ints ints;
  Floats floats;
  size_t at = 0;
  for_each_leaf(space, [&](const Space& leaf) {
    for (size_t j = 0; j < leaf.size(); ++j, ++at) {
      const float v = row[at];
      if (!integral(leaf)) {
        floats.push_back(v);
      } else if (!std::isfinite(v) || std::nearbyint(v) != v) {
        throw invalid_value("to_action: " + std::to_string(v) + " is not an integer");
      } else {
        ints.push_back(static_cast<int64_t>(v));
      }
    }
  });
  return Action::of(std::move(ints), std::move(floats));
}

Floats to_row(const Space& space, const Action& action) {
  check_action(space, action, "to_row");
  Floats row;
  row.reserve(space.size());
  Cursor at;
  for_each_leaf(space, [&](const Space& leaf) {
    for (size_t j = 0; j < leaf.size(); ++j)
      row.push_back(integral(leaf) ? static_cast<float>(action.ints()[at.ints++]) : action.floats()[at.floats++]);
  });
  return row;
}

std::vector<Action> to_actions(const Space& space, const Floats& rows, size_t n) {
  check_rows(space, rows.size(), n, "to_actions");
  std::vector<Action> out;
  out.reserve(n);
  for (size_t r = 0; r < n; ++r)
    out.push_back(to_action(space, Floats(rows.begin() + r * space.size(), rows.begin() + (r + 1) * space.size())));
  return out;
}

// ---------------------------------------------------------------- on the wire

void fill_actions(pb::Value* value, const Space& space, const std::vector<const Action*>& actions,
                  const std::string& what) {
  for (const Action* a : actions) check_action(space, *a, what);
  Cursor at;
  fill_typed(value, space, actions, at, what);
}

std::vector<Action> decode_actions(const Space& space, const pb::Value& value, size_t n, const std::string& what) {
  std::vector<Action> out(n);
  std::vector<Ints> ints(n);
  std::vector<Floats> floats(n);
  decode_typed(space, value, out, ints, floats, what);
  for (size_t r = 0; r < n; ++r) out[r] = Action::of(std::move(ints[r]), std::move(floats[r]));
  return out;
}

}  // namespace simbridge
