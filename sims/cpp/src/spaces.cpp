// Spaces, the flatten rule and rows of values on the wire (see wire.hpp).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <type_traits>

#include "wire.hpp"

namespace simbridge {

// ---------------------------------------------------------------- spaces

Space Space::Box(Floats low, Floats high) {
  std::vector<int64_t> shape{static_cast<int64_t>(low.size())};
  return Box(std::move(low), std::move(high), std::move(shape));
}

Space Space::Box(Floats low, Floats high, std::vector<int64_t> shape) {
  if (low.size() != high.size() || low.size() != elements(shape))
    throw invalid_value("Box: low, high and shape disagree on the number of elements");
  Space s;
  s.kind = Kind::Box;
  s.low = std::move(low);
  s.high = std::move(high);
  s.shape = std::move(shape);
  return s;
}

Space Space::Image(std::vector<int64_t> shape) {
  if (shape.empty()) throw invalid_value("Image: shape must not be empty");
  for (int64_t side : shape)
    if (side <= 0) throw invalid_value("Image: every side of the shape must be positive");
  const size_t n = elements(shape);
  Space s = Box(Floats(n, 0.0f), Floats(n, 255.0f), std::move(shape));
  s.dtype = DType::UInt8;
  return s;
}

Space Space::Discrete(int64_t n, int64_t start) {
  if (n <= 0) throw invalid_value("Discrete: n must be positive");
  Space s;
  s.kind = Kind::Discrete;
  s.n = n;
  s.start = start;
  return s;
}

Space Space::MultiDiscrete(std::vector<int64_t> nvec, std::vector<int64_t> start) {
  if (start.empty()) start.assign(nvec.size(), 0);
  if (start.size() != nvec.size()) throw invalid_value("MultiDiscrete: start and nvec differ in length");
  for (int64_t k : nvec)
    if (k <= 0) throw invalid_value("MultiDiscrete: nvec must be positive");
  Space s;
  s.kind = Kind::MultiDiscrete;
  s.nvec = std::move(nvec);
  s.starts = std::move(start);
  return s;
}

Space Space::MultiBinary(std::vector<int64_t> shape) {
  if (shape.empty()) throw invalid_value("MultiBinary: shape must not be empty");
  Space s;
  s.kind = Kind::MultiBinary;
  s.shape = std::move(shape);
  return s;
}

Space Space::Dict(std::vector<std::string> names, std::vector<Space> spaces) {
  if (names.size() != spaces.size()) throw invalid_value("Dict: one name per space");
  Space s;
  s.kind = Kind::Dict;
  s.names = std::move(names);
  s.children = std::move(spaces);
  return s;
}

Space Space::Tuple(std::vector<Space> spaces) {
  Space s;
  s.kind = Kind::Tuple;
  s.children = std::move(spaces);
  return s;
}

size_t Space::size() const {
  switch (kind) {
    case Kind::Box: case Kind::MultiBinary: return elements(shape);
    case Kind::Discrete: return 1;
    case Kind::MultiDiscrete: return nvec.size();
    default: {
      size_t n = 0;
      for (const auto& c : children) n += c.size();
      return n;
    }
  }
}

size_t Space::flat_size() const {
  switch (kind) {
    case Kind::Box: case Kind::MultiBinary: return elements(shape);
    case Kind::Discrete: return static_cast<size_t>(n);
    case Kind::MultiDiscrete: {
      size_t total = 0;
      for (int64_t k : nvec) total += static_cast<size_t>(k);
      return total;
    }
    default: {
      size_t total = 0;
      for (const auto& c : children) total += c.flat_size();
      return total;
    }
  }
}

namespace {

void flatten_into(const Space& s, const float* v, Floats& out) {
  auto one_hot = [&](float value, int64_t start, int64_t n) {
    double idx = std::nearbyint(static_cast<double>(value)) - static_cast<double>(start);
    if (!(idx >= 0 && idx < static_cast<double>(n)))
      throw invalid_value("flatten: value " + std::to_string(value) + " is outside its discrete space");
    size_t base = out.size();
    out.resize(base + static_cast<size_t>(n), 0.0f);
    out[base + static_cast<size_t>(idx)] = 1.0f;
  };
  switch (s.kind) {
    case Space::Kind::Box: case Space::Kind::MultiBinary: out.insert(out.end(), v, v + s.size()); return;
    case Space::Kind::Discrete: one_hot(v[0], s.start, s.n); return;
    case Space::Kind::MultiDiscrete:
      for (size_t i = 0; i < s.nvec.size(); ++i) one_hot(v[i], s.starts[i], s.nvec[i]);
      return;
    default:
      for (const auto& c : s.children) {
        flatten_into(c, v, out);
        v += c.size();
      }
  }
}

}  // namespace

Floats flatten(const Space& space, const Floats& row) {
  if (row.size() != space.size())
    throw invalid_value("flatten: a row of this space has " + std::to_string(space.size()) + " values, got " +
                        std::to_string(row.size()));
  Floats out;
  out.reserve(space.flat_size());
  flatten_into(space, row.data(), out);
  return out;
}

void space_to_proto(const Space& s, pb::Space* msg) {
  switch (s.kind) {
    case Space::Kind::Box:
      fill_box_tensor(msg->mutable_box()->mutable_low(), s, s.low, s.shape, "Box low");
      fill_box_tensor(msg->mutable_box()->mutable_high(), s, s.high, s.shape, "Box high");
      return;
    case Space::Kind::Discrete:
      msg->mutable_discrete()->set_n(s.n);
      msg->mutable_discrete()->set_start(s.start);
      return;
    case Space::Kind::MultiDiscrete: {
      std::vector<int64_t> shape{static_cast<int64_t>(s.nvec.size())};
      auto* md = msg->mutable_multi_discrete();
      fill_tensor(md->mutable_nvec(), pb::INT64, s.nvec.data(), s.nvec.size() * 8, shape);
      fill_tensor(md->mutable_start(), pb::INT64, s.starts.data(), s.starts.size() * 8, shape);
      return;
    }
    case Space::Kind::MultiBinary:
      msg->mutable_multi_binary()->mutable_shape()->Assign(s.shape.begin(), s.shape.end());
      return;
    case Space::Kind::Dict: {
      auto* d = msg->mutable_dict();
      for (size_t i = 0; i < s.children.size(); ++i) {
        auto* named = d->add_spaces();
        named->set_name(s.names[i]);
        space_to_proto(s.children[i], named->mutable_space());
      }
      return;
    }
    case Space::Kind::Tuple: {
      auto* t = msg->mutable_tuple();
      for (const auto& c : s.children) space_to_proto(c, t->add_spaces());
      return;
    }
  }
}

Space space_from_proto(const pb::Space& msg, const std::string& what) {
  switch (msg.kind_case()) {
    case pb::Space::kBox: {
      const auto& box = msg.box();
      if (box.low().dtype() != box.high().dtype()) throw invalid_value(what + ": Box low and high differ in dtype");
      Floats low = tensor_floats(box.low(), what + " low"), high = tensor_floats(box.high(), what + " high");
      std::vector<int64_t> shape(box.low().shape().begin(), box.low().shape().end());
      Space s = Space::Box(std::move(low), std::move(high), std::move(shape));
      // Other dtypes read as float32 boxes, as before: the SDK sends only float32 and uint8.
      if (box.low().dtype() == pb::UINT8) s.dtype = Space::DType::UInt8;
      return s;
    }
    case pb::Space::kDiscrete: return Space::Discrete(msg.discrete().n(), msg.discrete().start());
    case pb::Space::kMultiDiscrete: {
      const auto& md = msg.multi_discrete();
      std::vector<int64_t> start;
      if (md.has_start()) start = tensor_ints(md.start(), what + " start");
      return Space::MultiDiscrete(tensor_ints(md.nvec(), what + " nvec"), std::move(start));
    }
    case pb::Space::kMultiBinary:
      return Space::MultiBinary({msg.multi_binary().shape().begin(), msg.multi_binary().shape().end()});
    case pb::Space::kDict: {
      std::vector<std::string> names;
      std::vector<Space> spaces;
      for (const auto& named : msg.dict().spaces()) {
        names.push_back(named.name());
        spaces.push_back(space_from_proto(named.space(), what + "." + named.name()));
      }
      return Space::Dict(std::move(names), std::move(spaces));
    }
    case pb::Space::kTuple: {
      std::vector<Space> spaces;
      for (const auto& sub : msg.tuple().spaces()) spaces.push_back(space_from_proto(sub, what));
      return Space::Tuple(std::move(spaces));
    }
    default: throw invalid_value(what + ": empty or unknown Space");
  }
}

// ---------------------------------------------------------------- values

void check_rows(const Space& space, size_t floats, size_t n, const std::string& what) {
  if (floats != n * space.size())
    throw invalid_value(what + ": " + std::to_string(n) + " rows of " + std::to_string(space.size()) +
                        " values each need " + std::to_string(n * space.size()) + " floats, got " +
                        std::to_string(floats));
}

namespace {

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// v as the integer type T, or an Error naming the leaf and v: a float outside T's range would be
// undefined behaviour to cast, and a wrapped value a silent wrong pixel or index.
template <typename T>
T integer(float v, const std::string& what) {
  using Limits = std::numeric_limits<T>;
  const double d = v, lowest = static_cast<double>(Limits::lowest());
  const double above = std::ldexp(1.0, Limits::digits);  // max + 1, exact in a double even for int64
  if (!std::isfinite(d) || std::nearbyint(d) != d) throw invalid_value(what + ": " + number(d) + " is not an integer");
  if (d < lowest || d >= above)
    throw invalid_value(what + ": " + number(d) + " is outside [" + std::to_string(Limits::lowest()) + ", " +
                        std::to_string(Limits::max()) + "]");
  return static_cast<T>(d);
}

// The leaf column [offset, offset + k) of n rows of `stride` floats; an integer T takes integers only.
template <typename T>
std::vector<T> gather(const float* rows, size_t n, size_t stride, size_t offset, size_t k, const std::string& what) {
  std::vector<T> out(n * k);
  for (size_t r = 0; r < n; ++r) {
    for (size_t j = 0; j < k; ++j) {
      const float v = rows[r * stride + offset + j];
      if constexpr (std::is_integral_v<T>) out[r * k + j] = integer<T>(v, what);
      else out[r * k + j] = v;
    }
  }
  return out;
}

}  // namespace

void fill_box_tensor(pb::Tensor* t, const Space& box, const Floats& values, const std::vector<int64_t>& shape,
                     const std::string& what) {
  if (box.dtype == Space::DType::Float32) return fill_float_tensor(t, values, shape);
  // A camera's frame is 10^4-10^6 values a step: one branch-free pass the compiler vectorises
  // (NaN clamps to 0 and then differs from itself), the per-value check only to name a bad one.
  std::vector<uint8_t> bytes(values.size());
  bool all_pixels = true;
  for (size_t i = 0; i < values.size(); ++i) {
    const float v = values[i];
    float c = v > 0.0f ? v : 0.0f;
    c = c < 255.0f ? c : 255.0f;
    const int level = static_cast<int>(c);
    all_pixels &= (c == v) & (static_cast<float>(level) == c);
    bytes[i] = static_cast<uint8_t>(level);
  }
  if (!all_pixels)
    for (float v : values) integer<uint8_t>(v, what);   // throws for the first value that is no pixel
  fill_tensor(t, pb::UINT8, bytes.data(), bytes.size(), shape);
}

namespace {

void fill_leafs(pb::Value* value, const Space& s, const float* rows, size_t n, size_t stride, size_t offset,
                const std::string& what) {
  const size_t k = s.size();
  std::vector<int64_t> shape{static_cast<int64_t>(n)};
  switch (s.kind) {
    case Space::Kind::Box: {
      shape.insert(shape.end(), s.shape.begin(), s.shape.end());
      fill_box_tensor(value->mutable_tensor(), s, gather<float>(rows, n, stride, offset, k, what), shape, what);
      return;
    }
    case Space::Kind::Discrete: case Space::Kind::MultiDiscrete: {
      if (s.kind == Space::Kind::MultiDiscrete) shape.push_back(static_cast<int64_t>(k));
      auto leaf = gather<int64_t>(rows, n, stride, offset, k, what);
      fill_tensor(value->mutable_tensor(), pb::INT64, leaf.data(), leaf.size() * 8, shape);
      return;
    }
    case Space::Kind::MultiBinary: {
      shape.insert(shape.end(), s.shape.begin(), s.shape.end());
      auto leaf = gather<int8_t>(rows, n, stride, offset, k, what);
      fill_tensor(value->mutable_tensor(), pb::INT8, leaf.data(), leaf.size(), shape);
      return;
    }
    case Space::Kind::Dict: {
      auto* items = value->mutable_dict()->mutable_items();
      for (size_t i = 0; i < s.children.size(); ++i) {
        fill_leafs(&(*items)[s.names[i]], s.children[i], rows, n, stride, offset, what + "." + s.names[i]);
        offset += s.children[i].size();
      }
      return;
    }
    case Space::Kind::Tuple: {
      auto* tuple = value->mutable_tuple();
      for (const auto& c : s.children) {
        fill_leafs(tuple->add_items(), c, rows, n, stride, offset, what);
        offset += c.size();
      }
      return;
    }
  }
}

void decode_leafs(const Space& s, const pb::Value& value, size_t n, float* rows, size_t stride, size_t offset,
                  const std::string& what) {
  if (s.kind == Space::Kind::Dict || s.kind == Space::Kind::Tuple) {
    for (size_t i = 0; i < s.children.size(); ++i) {
      const pb::Value* sub = nullptr;
      if (s.kind == Space::Kind::Dict) {
        if (!value.has_dict()) throw invalid_value(what + ": expected a dict value");
        auto it = value.dict().items().find(s.names[i]);
        if (it == value.dict().items().end()) throw invalid_value(what + ": key " + s.names[i] + " is missing");
        sub = &it->second;
      } else {
        if (!value.has_tuple() || value.tuple().items_size() != static_cast<int>(s.children.size()))
          throw invalid_value(what + ": expected a tuple of " + std::to_string(s.children.size()) + " values");
        sub = &value.tuple().items(static_cast<int>(i));
      }
      decode_leafs(s.children[i], *sub, n, rows, stride, offset, what);
      offset += s.children[i].size();
    }
    return;
  }
  if (!value.has_tensor()) throw invalid_value(what + ": expected a tensor");
  const size_t k = s.size();
  Floats leaf = tensor_floats(value.tensor(), what);
  if (leaf.size() != n * k || value.tensor().shape_size() == 0 || value.tensor().shape(0) != static_cast<int64_t>(n))
    throw invalid_value(what + ": expected " + std::to_string(n) + " rows of " + std::to_string(k) + " values");
  for (size_t r = 0; r < n; ++r)
    std::memcpy(rows + r * stride + offset, leaf.data() + r * k, k * sizeof(float));
}

}  // namespace

void fill_value(pb::Value* value, const Space& space, const float* rows, size_t n, const std::string& what) {
  fill_leafs(value, space, rows, n, space.size(), 0, what);
}

Floats decode_value(const Space& space, const pb::Value& value, size_t n, const std::string& what) {
  Floats rows(n * space.size());
  decode_leafs(space, value, n, rows.data(), space.size(), 0, what);
  return rows;
}

}  // namespace simbridge
