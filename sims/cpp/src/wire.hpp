// The wire forms of the SDK's values: tensors, spaces, rows of values, errors (internal).
#pragma once

#include <string>
#include <vector>

#include <grpcpp/support/status.h>

#include "google/rpc/status.pb.h"
#include "simbridge/client.hpp"
#include "simbridge/v1/simbridge.pb.h"

namespace simbridge {
namespace pb = ::simbridge::v1;

// ---------------------------------------------------------------- tensors
void fill_tensor(pb::Tensor* t, pb::DType dtype, const void* data, size_t bytes, const std::vector<int64_t>& shape);
void fill_float_tensor(pb::Tensor* t, const Floats& values, const std::vector<int64_t>& shape);
void fill_bool_tensor(pb::Tensor* t, const std::vector<bool>& values);
// Any dtype, as floats (integers converted); INVALID_ARGUMENT/INVALID_VALUE when the bytes do not
// match dtype and shape.
Floats tensor_floats(const pb::Tensor& t, const std::string& what);
std::vector<int64_t> tensor_ints(const pb::Tensor& t, const std::string& what);
size_t elements(const std::vector<int64_t>& shape);

// ---------------------------------------------------------------- spaces and values
void space_to_proto(const Space& space, pb::Space* msg);
Space space_from_proto(const pb::Space& msg, const std::string& what);
// Values of a Box leaf (its bounds, or n rows of it) as a tensor of the box's dtype: a uint8 box's
// values must be integers in [0, 255], else INVALID_VALUE naming `what` and the value.
void fill_box_tensor(pb::Tensor* t, const Space& box, const Floats& values, const std::vector<int64_t>& shape,
                     const std::string& what);
// n rows of the space's values (n * space.size() floats) -> a Value whose leaves are (n, *shape).
void fill_value(pb::Value* value, const Space& space, const float* rows, size_t n, const std::string& what);
// A Value of n rows -> n * space.size() floats, row-major.
Floats decode_value(const Space& space, const pb::Value& value, size_t n, const std::string& what);
void check_rows(const Space& space, size_t floats, size_t n, const std::string& what);

// Typed actions (simbridge/action.hpp): integer leaves straight to and from the wire's integer
// tensors. fill_actions: n Actions -> a Value whose leaves are (n, *shape); decode_actions: back.
void fill_actions(pb::Value* value, const Space& space, const std::vector<const Action*>& actions,
                  const std::string& what);
std::vector<Action> decode_actions(const Space& space, const pb::Value& value, size_t n, const std::string& what);

// ---------------------------------------------------------------- errors
Error invalid_value(const std::string& message);
Error invalid_request(const std::string& message);
// The ErrorReason name in a status' details (its google.rpc.ErrorInfo of domain simbridge.v1), or "".
std::string reason_in(const google::rpc::Status& status);
Error error_from_status(const google::rpc::Status& status, const std::string& prefix = "");
Error error_from_grpc(const grpc::Status& status, const std::string& prefix = "");
std::string default_reason(StatusCode code);
// gRPC's code as the SDK's: the same canonical numbers (checked in wire.cpp).
StatusCode from_grpc(grpc::StatusCode code);

}  // namespace simbridge
