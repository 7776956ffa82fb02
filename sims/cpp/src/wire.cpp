// Tensors and errors on the wire (see wire.hpp).
#include "wire.hpp"

#include <cmath>
#include <cstring>

#include <google/protobuf/unknown_field_set.h>

namespace simbridge {

// ---------------------------------------------------------------- errors

Error::Error(StatusCode code, const std::string& message, std::string reason)
    : std::runtime_error(message), code_(code), reason_(std::move(reason)) {}

// The public enum copies gRPC's numbers so that the headers need no gRPC: keep them in step.
static_assert(static_cast<int>(StatusCode::CANCELLED) == grpc::StatusCode::CANCELLED, "canonical codes");
static_assert(static_cast<int>(StatusCode::RESOURCE_EXHAUSTED) == grpc::StatusCode::RESOURCE_EXHAUSTED, "canonical codes");
static_assert(static_cast<int>(StatusCode::UNAVAILABLE) == grpc::StatusCode::UNAVAILABLE, "canonical codes");
static_assert(static_cast<int>(StatusCode::UNAUTHENTICATED) == grpc::StatusCode::UNAUTHENTICATED, "canonical codes");

StatusCode from_grpc(grpc::StatusCode code) {
  const int n = static_cast<int>(code);
  return n >= 0 && n <= 16 ? static_cast<StatusCode>(n) : StatusCode::UNKNOWN;
}

const char* status_code_name(StatusCode code) {
  static const char* const kNames[] = {
      "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
      "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
      "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  const int n = static_cast<int>(code);
  return n >= 0 && n <= 16 ? kNames[n] : "UNKNOWN";
}

Error invalid_value(const std::string& message) {
  return Error(StatusCode::INVALID_ARGUMENT, message, "INVALID_VALUE");
}

Error invalid_request(const std::string& message) {
  return Error(StatusCode::INVALID_ARGUMENT, message, "INVALID_REQUEST");
}

std::string default_reason(StatusCode code) {
  // What an error means when its sender gave no reason (as simbridge/wire/errors.py decides).
  switch (code) {
    case StatusCode::INVALID_ARGUMENT: return "INVALID_REQUEST";
    case StatusCode::RESOURCE_EXHAUSTED: return "MESSAGE_TOO_LARGE";  // gRPC's own size refusal
    case StatusCode::UNAVAILABLE: return "SERVER_UNAVAILABLE";
    case StatusCode::INTERNAL:
    case StatusCode::UNKNOWN: return "SERVER_FAILURE";
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
  auto code = status.code() >= 0 && status.code() <= 16 ? static_cast<StatusCode>(status.code()) : StatusCode::UNKNOWN;
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
  const StatusCode code = from_grpc(status.error_code());
  return Error(code, prefix + message, reason.empty() ? default_reason(code) : reason);
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

}  // namespace simbridge
