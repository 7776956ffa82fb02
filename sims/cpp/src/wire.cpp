// Tensors, spaces, rows of values and errors on the wire (see wire.hpp).
#include "wire.hpp"

#include <cmath>
#include <cstring>

#include <google/protobuf/unknown_field_set.h>

namespace simbridge {

// ---------------------------------------------------------------- errors

Error::Error(grpc::StatusCode code, const std::string& message, std::string reason)
    : std::runtime_error(message), code_(code), reason_(std::move(reason)) {}

Error invalid_value(const std::string& message) {
  return Error(grpc::StatusCode::INVALID_ARGUMENT, message, "INVALID_VALUE");
}

Error invalid_request(const std::string& message) {
  return Error(grpc::StatusCode::INVALID_ARGUMENT, message, "INVALID_REQUEST");
}

std::string default_reason(grpc::StatusCode code) {
  // What an error means when its sender gave no reason (as simbridge/wire/errors.py decides).
  switch (code) {
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_REQUEST";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "MESSAGE_TOO_LARGE";  // gRPC's own size refusal
    case grpc::StatusCode::UNAVAILABLE: return "SERVER_UNAVAILABLE";
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::UNKNOWN: return "SERVER_FAILURE";
    default: return "ERROR_REASON_UNSPECIFIED";
  }
}

std::string reason_in(const google::rpc::Status& status) {
  static const std::string kType = "google.rpc.ErrorInfo";
  for (const auto& any : status.details()) {
    const std::string& url = any.type_url();
    if (url.size() < kType.size() || url.compare(url.size() - kType.size(), kType.size(), kType) != 0) continue;
    // ErrorInfo is {reason = 1, domain = 2, metadata = 3}: read it field by field rather than
    // generating google/rpc/error_details.proto for two strings.
    google::protobuf::UnknownFieldSet fields;
    if (!fields.ParseFromString(any.value())) continue;
    std::string reason, domain;
    for (int i = 0; i < fields.field_count(); ++i) {
      const auto& f = fields.field(i);
      if (f.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) continue;
      if (f.number() == 1) reason = f.length_delimited();
      if (f.number() == 2) domain = f.length_delimited();
    }
    if (domain == "simbridge.v1" && !reason.empty()) {
      pb::ErrorReason value;
      if (pb::ErrorReason_Parse(reason, &value)) return reason;
    }
  }
  return "";
}

Error error_from_status(const google::rpc::Status& status, const std::string& prefix) {
  auto code = static_cast<grpc::StatusCode>(status.code());
  if (status.code() < 0 || status.code() > 16) code = grpc::StatusCode::UNKNOWN;
  std::string reason = reason_in(status);
  return Error(code, prefix + status.message(), reason.empty() ? default_reason(code) : reason);
}

Error error_from_grpc(const grpc::Status& status, const std::string& prefix) {
  std::string reason;
  if (!status.error_details().empty()) {  // the "grpc-status-details-bin" trailer
    google::rpc::Status details;
    if (details.ParseFromString(status.error_details())) reason = reason_in(details);
  }
  std::string message = status.error_message().empty() ? "gRPC status " + std::to_string(status.error_code())
                                                        : status.error_message();
  return Error(status.error_code(), prefix + message, reason.empty() ? default_reason(status.error_code()) : reason);
}

// ---------------------------------------------------------------- tensors

size_t elements(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

void fill_tensor(pb::Tensor* t, pb::DType dtype, const void* data, size_t bytes, const std::vector<int64_t>& shape) {
  // Tensors are little-endian on the wire, as on every host this SDK builds for (x86-64, arm64).
  static_assert(sizeof(float) == 4, "float32");
  t->set_dtype(dtype);
  t->mutable_shape()->Assign(shape.begin(), shape.end());
  t->set_data(data, bytes);
}

void fill_float_tensor(pb::Tensor* t, const Floats& values, const std::vector<int64_t>& shape) {
  fill_tensor(t, pb::FLOAT32, values.data(), values.size() * sizeof(float), shape);
}

void fill_bool_tensor(pb::Tensor* t, const std::vector<bool>& values) {
  std::string bytes(values.size(), '\0');
  for (size_t i = 0; i < values.size(); ++i) bytes[i] = values[i] ? 1 : 0;
  fill_tensor(t, pb::BOOL, bytes.data(), bytes.size(), {static_cast<int64_t>(values.size())});
}

namespace {

size_t itemsize(int dtype) {
  switch (dtype) {
    case pb::FLOAT32: case pb::INT32: case pb::UINT32: return 4;
    case pb::FLOAT64: case pb::INT64: case pb::UINT64: return 8;
    case pb::FLOAT16: case pb::INT16: case pb::UINT16: return 2;
    case pb::INT8: case pb::UINT8: case pb::BOOL: return 1;
    default: return 0;
  }
}

template <typename T>
T load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

float half_to_float(uint16_t h) {
  int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float v = exp == 0 ? std::ldexp(static_cast<float>(mant), -24)
                     : exp == 31 ? (mant ? NAN : INFINITY) : std::ldexp(static_cast<float>(mant | 0x400), exp - 25);
  return (h & 0x8000) ? -v : v;
}

// Element i of a checked tensor as a double (exact for every integer the SDK meets).
double element(const pb::Tensor& t, size_t i) {
  const char* p = t.data().data() + i * itemsize(t.dtype());
  switch (t.dtype()) {
    case pb::FLOAT32: return load<float>(p);
    case pb::FLOAT64: return load<double>(p);
    case pb::FLOAT16: return half_to_float(load<uint16_t>(p));
    case pb::INT8: return load<int8_t>(p);
    case pb::INT16: return load<int16_t>(p);
    case pb::INT32: return load<int32_t>(p);
    case pb::INT64: return static_cast<double>(load<int64_t>(p));
    case pb::UINT8: return load<uint8_t>(p);
    case pb::UINT16: return load<uint16_t>(p);
    case pb::UINT32: return load<uint32_t>(p);
    case pb::UINT64: return static_cast<double>(load<uint64_t>(p));
    case pb::BOOL: return load<uint8_t>(p) ? 1.0 : 0.0;
    default: return NAN;
  }
}

size_t checked_elements(const pb::Tensor& t, const std::string& what) {
  size_t size = itemsize(t.dtype());
  if (size == 0) throw invalid_value(what + ": tensor dtype " + std::to_string(t.dtype()) + " is not supported");
  size_t n = 1;
  for (int64_t d : t.shape()) {
    if (d < 0) throw invalid_value(what + ": tensor shape has a negative dimension");
    n *= static_cast<size_t>(d);
  }
  if (t.data().size() != n * size)
    throw invalid_value(what + ": tensor data has " + std::to_string(t.data().size()) + " bytes, its shape needs " +
                        std::to_string(n * size));
  return n;
}

}  // namespace

Floats tensor_floats(const pb::Tensor& t, const std::string& what) {
  size_t n = checked_elements(t, what);
  Floats out(n);
  if (t.dtype() == pb::FLOAT32) {
    std::memcpy(out.data(), t.data().data(), n * sizeof(float));
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(element(t, i));
  }
  return out;
}

std::vector<int64_t> tensor_ints(const pb::Tensor& t, const std::string& what) {
  size_t n = checked_elements(t, what);
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    out[i] = t.dtype() == pb::INT64 ? load<int64_t>(t.data().data() + 8 * i) : static_cast<int64_t>(element(t, i));
  }
  return out;
}

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
      fill_float_tensor(msg->mutable_box()->mutable_low(), s.low, s.shape);
      fill_float_tensor(msg->mutable_box()->mutable_high(), s.high, s.shape);
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
      Floats low = tensor_floats(msg.box().low(), what + " low"), high = tensor_floats(msg.box().high(), what + " high");
      std::vector<int64_t> shape(msg.box().low().shape().begin(), msg.box().low().shape().end());
      return Space::Box(std::move(low), std::move(high), std::move(shape));
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

// The leaf column [offset, offset + k) of n rows of `stride` floats.
template <typename T>
std::vector<T> gather(const float* rows, size_t n, size_t stride, size_t offset, size_t k, const std::string& what,
                      bool integral) {
  std::vector<T> out(n * k);
  for (size_t r = 0; r < n; ++r) {
    for (size_t j = 0; j < k; ++j) {
      float v = rows[r * stride + offset + j];
      if (integral) {
        if (!std::isfinite(v) || std::nearbyint(v) != v) throw invalid_value(what + ": " + std::to_string(v) + " is not an integer");
        out[r * k + j] = static_cast<T>(std::nearbyint(v));
      } else {
        out[r * k + j] = static_cast<T>(v);
      }
    }
  }
  return out;
}

void fill_leafs(pb::Value* value, const Space& s, const float* rows, size_t n, size_t stride, size_t offset,
                const std::string& what) {
  const size_t k = s.size();
  std::vector<int64_t> shape{static_cast<int64_t>(n)};
  switch (s.kind) {
    case Space::Kind::Box: {
      shape.insert(shape.end(), s.shape.begin(), s.shape.end());
      auto leaf = gather<float>(rows, n, stride, offset, k, what, false);
      fill_tensor(value->mutable_tensor(), pb::FLOAT32, leaf.data(), leaf.size() * 4, shape);
      return;
    }
    case Space::Kind::Discrete: case Space::Kind::MultiDiscrete: {
      if (s.kind == Space::Kind::MultiDiscrete) shape.push_back(static_cast<int64_t>(k));
      auto leaf = gather<int64_t>(rows, n, stride, offset, k, what, true);
      fill_tensor(value->mutable_tensor(), pb::INT64, leaf.data(), leaf.size() * 8, shape);
      return;
    }
    case Space::Kind::MultiBinary: {
      shape.insert(shape.end(), s.shape.begin(), s.shape.end());
      auto leaf = gather<int8_t>(rows, n, stride, offset, k, what, true);
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
