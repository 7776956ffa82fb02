// Unit tests of the SDK's pieces that need no server: tensor encoding, space messages, rows of
// values, the flatten rule, error reasons, backoff, LocalPolicy on hand-built PortablePolicies, and
// the client's credentials (which token, which files, which flags). The bridge addresses' tests are
// in hosts_tests.cpp, typed actions, status codes and the log callback in typed_tests.cpp, all
// linked into the same program.
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <cstring>
#include <functional>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include <grpcpp/grpcpp.h>

#include "backoff.hpp"
#include "connection.hpp"
#include "credentials.hpp"
#include "harness.hpp"
#include "wire.hpp"

using namespace simbridge;

namespace {

bool near(double a, double b, double tol = 1e-5) { return std::fabs(a - b) <= tol * (1 + std::fabs(b)); }

template <typename T>
std::vector<T> raw(const pb::Tensor& t) {
  std::vector<T> out(t.data().size() / sizeof(T));
  std::memcpy(out.data(), t.data().data(), t.data().size());
  return out;
}

// ---------------------------------------------------------------- tensors

TEST(float_tensor_is_little_endian_float32_with_its_shape) {
  pb::Tensor t;
  fill_float_tensor(&t, {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, 7.0f}, {2, 3});
  CHECK(t.dtype() == pb::FLOAT32);
  CHECK(t.shape_size() == 2 && t.shape(0) == 2 && t.shape(1) == 3);
  CHECK(t.data().size() == 24);
  const unsigned char* p = reinterpret_cast<const unsigned char*>(t.data().data());
  CHECK(p[0] == 0x00 && p[1] == 0x00 && p[2] == 0xc0 && p[3] == 0x3f);  // 1.5f, little-endian
  CHECK(tensor_floats(t, "t") == Floats({1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, 7.0f}));
}

TEST(tensors_of_every_dtype_decode_to_floats_and_bad_sizes_are_refused) {
  pb::Tensor t;
  int64_t ints[3] = {-3, 0, 1 << 20};
  fill_tensor(&t, pb::INT64, ints, sizeof ints, {3});
  CHECK(tensor_floats(t, "t") == Floats({-3.0f, 0.0f, 1048576.0f}));
  CHECK(tensor_ints(t, "t") == std::vector<int64_t>({-3, 0, 1 << 20}));
  uint8_t bools[2] = {1, 0};
  fill_tensor(&t, pb::BOOL, bools, 2, {2});
  CHECK(tensor_floats(t, "t") == Floats({1.0f, 0.0f}));
  uint16_t half = 0x3e00;  // 1.5 in float16
  fill_tensor(&t, pb::FLOAT16, &half, 2, {1});
  CHECK(tensor_floats(t, "t") == Floats({1.5f}));
  double d[1] = {0.25};
  fill_tensor(&t, pb::FLOAT64, d, 8, {2});  // shape says 2 elements, 8 bytes hold one
  CHECK_THROWS_REASON(tensor_floats(t, "t"), "INVALID_VALUE");
  t.set_dtype(pb::DTYPE_UNSPECIFIED);
  CHECK_THROWS_REASON(tensor_floats(t, "t"), "INVALID_VALUE");
}

// ---------------------------------------------------------------- spaces and values

Space nested() {
  return Space::Dict({"pos", "mode", "tuple"},
                     {Space::Box({-1, -1}, {1, 1}), Space::Discrete(3, 1),
                      Space::Tuple({Space::MultiDiscrete({2, 3}), Space::MultiBinary({2})})});
}

TEST(space_messages_follow_the_proto_and_round_trip) {
  pb::Space msg;
  space_to_proto(Space::Box({-1, -2}, {1, 2}), &msg);
  CHECK(msg.has_box() && msg.box().low().dtype() == pb::FLOAT32 && msg.box().low().shape(0) == 2);
  CHECK(raw<float>(msg.box().high()) == std::vector<float>({1, 2}));
  msg.Clear();
  space_to_proto(Space::Discrete(5, 2), &msg);
  CHECK(msg.discrete().n() == 5 && msg.discrete().start() == 2);
  msg.Clear();
  space_to_proto(nested(), &msg);
  CHECK(msg.dict().spaces_size() == 3 && msg.dict().spaces(0).name() == "pos");
  const auto& tup = msg.dict().spaces(2).space().tuple();
  CHECK(raw<int64_t>(tup.spaces(0).multi_discrete().nvec()) == std::vector<int64_t>({2, 3}));
  CHECK(tup.spaces(1).multi_binary().shape(0) == 2);
  Space back = space_from_proto(msg, "space");
  CHECK(back.kind == Space::Kind::Dict && back.size() == 7 && back.flat_size() == 2 + 3 + 5 + 2);
  CHECK(back.children[1].start == 1 && back.children[2].children[0].nvec == std::vector<int64_t>({2, 3}));
  CHECK_THROWS_REASON(space_from_proto(pb::Space(), "space"), "INVALID_VALUE");
  CHECK_THROWS_REASON(Space::Discrete(0), "INVALID_VALUE");
}

TEST(rows_of_values_become_leaves_with_the_row_dimension_first) {
  Space s = nested();
  // Two rows: pos(2) mode(1) md(2) mb(2)
  Floats rows{0.5f, -0.5f, 3, 1, 2, 1, 0, /**/ 0.25f, 0.75f, 1, 0, 0, 0, 1};
  pb::Value v;
  fill_value(&v, s, rows.data(), 2, "obs");
  const auto& items = v.dict().items();
  const auto& pos = items.at("pos").tensor();
  CHECK(pos.dtype() == pb::FLOAT32 && pos.shape_size() == 2 && pos.shape(0) == 2 && pos.shape(1) == 2);
  CHECK(raw<float>(pos) == std::vector<float>({0.5f, -0.5f, 0.25f, 0.75f}));
  const auto& mode = items.at("mode").tensor();
  CHECK(mode.dtype() == pb::INT64 && mode.shape_size() == 1 && raw<int64_t>(mode) == std::vector<int64_t>({3, 1}));
  const auto& md = items.at("tuple").tuple().items(0).tensor();
  CHECK(md.shape(1) == 2 && raw<int64_t>(md) == std::vector<int64_t>({1, 2, 0, 0}));
  const auto& mb = items.at("tuple").tuple().items(1).tensor();
  CHECK(mb.dtype() == pb::INT8 && raw<int8_t>(mb) == std::vector<int8_t>({1, 0, 0, 1}));
  CHECK(decode_value(s, v, 2, "obs") == rows);
  CHECK_THROWS_REASON(decode_value(s, v, 3, "obs"), "INVALID_VALUE");  // 2 rows on the wire
  Floats bad = rows;
  bad[2] = 1.5f;  // a Discrete value must be an integer
  CHECK_THROWS_REASON(fill_value(&v, s, bad.data(), 2, "obs"), "INVALID_VALUE");
  CHECK_THROWS_REASON(check_rows(s, rows.size() - 1, 2, "obs"), "INVALID_VALUE");
}

TEST(an_image_is_a_uint8_box_on_the_wire_as_the_python_sdk_sends_it) {
  Space img = Space::Image({2, 3, 1});
  CHECK(img.kind == Space::Kind::Box && img.dtype == Space::DType::UInt8 && img.size() == 6 && img.flat_size() == 6);
  CHECK(img.low == Floats(6, 0.0f) && img.high == Floats(6, 255.0f));
  CHECK(Space::Box({0}, {1}).dtype == Space::DType::Float32);
  pb::Space msg;
  space_to_proto(img, &msg);
  // gymnasium.spaces.Box(0, 255, (2, 3, 1), np.uint8) through simbridge.wire.spaces.space_to_proto
  for (const pb::Tensor* bound : {&msg.box().low(), &msg.box().high()}) {
    CHECK(bound->dtype() == pb::UINT8);
    CHECK(std::vector<int64_t>(bound->shape().begin(), bound->shape().end()) == std::vector<int64_t>({2, 3, 1}));
  }
  CHECK(msg.box().low().data() == std::string(6, '\0') && msg.box().high().data() == std::string(6, '\xff'));
  Space back = space_from_proto(msg, "space");
  CHECK(back.dtype == Space::DType::UInt8 && back.shape == img.shape && back.low == img.low && back.high == img.high);
  pb::Space again;
  space_to_proto(back, &again);
  CHECK(again.SerializeAsString() == msg.SerializeAsString());
  msg.mutable_box()->mutable_high()->set_dtype(pb::INT8);  // gymnasium's Box has one dtype
  CHECK_THROWS_REASON(space_from_proto(msg, "space"), "INVALID_VALUE");
  CHECK_THROWS_REASON(Space::Image({}), "INVALID_VALUE");
  CHECK_THROWS_REASON(Space::Image({84, 0, 3}), "INVALID_VALUE");
}

TEST(image_rows_travel_as_bytes_beside_float_leaves) {
  Space s = Space::Dict({"camera", "joints"}, {Space::Image({2, 2, 1}), Space::Box({-1, -1}, {1, 1})});
  Floats rows{0, 1, 254, 255, 0.5f, -0.5f, /**/ 7, 128, 200, 3, 0.25f, 1};
  pb::Value v;
  fill_value(&v, s, rows.data(), 2, "obs");
  const auto& camera = v.dict().items().at("camera").tensor();
  CHECK(camera.dtype() == pb::UINT8);
  CHECK(std::vector<int64_t>(camera.shape().begin(), camera.shape().end()) == std::vector<int64_t>({2, 2, 2, 1}));
  CHECK(raw<uint8_t>(camera) == std::vector<uint8_t>({0, 1, 254, 255, 7, 128, 200, 3}));
  const auto& joints = v.dict().items().at("joints").tensor();
  CHECK(joints.dtype() == pb::FLOAT32 && raw<float>(joints) == std::vector<float>({0.5f, -0.5f, 0.25f, 1}));
  CHECK(decode_value(s, v, 2, "obs") == rows);
  CHECK(flatten(s, Floats(rows.begin(), rows.begin() + 6)) == Floats(rows.begin(), rows.begin() + 6));
  const std::vector<std::pair<float, std::string>> refused{{256.0f, "obs.camera: 256 is outside [0, 255]"},
                                                           {-1.0f, "obs.camera: -1 is outside [0, 255]"},
                                                           {1.5f, "obs.camera: 1.5 is not an integer"},
                                                           {NAN, "obs.camera: nan is not an integer"}};
  for (const auto& [value, message] : refused) {
    Floats bad = rows;
    bad[8] = value;  // row 1's second pixel
    CHECK_THROWS_REASON(fill_value(&v, s, bad.data(), 2, "obs"), "INVALID_VALUE");
    CHECK(error_message([&] { fill_value(&v, s, bad.data(), 2, "obs"); }) == message);
  }
  // A typed action of an image space travels as bytes too, checked the same way.
  Action pixels = Action::box({3, 250});
  fill_actions(&v, Space::Image({2}), {&pixels}, "action");
  CHECK(v.tensor().dtype() == pb::UINT8 && raw<uint8_t>(v.tensor()) == std::vector<uint8_t>({3, 250}));
  Action too_bright = Action::box({3, 300});
  CHECK_THROWS_REASON(fill_actions(&v, Space::Image({2}), {&too_bright}, "action"), "INVALID_VALUE");
}

TEST(flatten_is_gymnasiums_rule) {
  Floats flat = flatten(nested(), {0.5f, -0.5f, 3, 1, 2, 1, 0});
  CHECK(flat == Floats({0.5f, -0.5f, /*mode 3, start 1*/ 0, 0, 1, /*md*/ 0, 1, 0, 0, 1, /*mb*/ 1, 0}));
  CHECK(flatten(Space::Discrete(4), {2}) == Floats({0, 0, 1, 0}));
  CHECK_THROWS_REASON(flatten(Space::Discrete(4), {4}), "INVALID_VALUE");
  CHECK_THROWS_REASON(flatten(Space::Discrete(4), {1, 2}), "INVALID_VALUE");
}

// ---------------------------------------------------------------- errors and backoff

std::string error_info(const std::string& reason, const std::string& domain) {
  // ErrorInfo {reason = 1; domain = 2}, encoded by hand.
  std::string out;
  out += static_cast<char>(0x0a);
  out += static_cast<char>(reason.size());
  out += reason;
  out += static_cast<char>(0x12);
  out += static_cast<char>(domain.size());
  out += domain;
  return out;
}

TEST(errors_carry_the_reason_of_their_error_info) {
  google::rpc::Status st;
  st.set_code(static_cast<int>(StatusCode::RESOURCE_EXHAUSTED));
  st.set_message("full");
  auto* any = st.add_details();
  any->set_type_url("type.googleapis.com/google.rpc.ErrorInfo");
  any->set_value(error_info("QUEUE_FULL", "simbridge.v1"));
  Error e = error_from_status(st);
  CHECK(e.code() == StatusCode::RESOURCE_EXHAUSTED && e.reason() == "QUEUE_FULL" && std::string(e.what()) == "full");
  Error via_trailer = error_from_grpc(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "full", st.SerializeAsString()));
  CHECK(via_trailer.reason() == "QUEUE_FULL" && via_trailer.code() == StatusCode::RESOURCE_EXHAUSTED);
  any->set_value(error_info("QUEUE_FULL", "other.domain"));  // not ours: the code's default
  CHECK(error_from_status(st).reason() == "MESSAGE_TOO_LARGE");
  CHECK(error_from_grpc(grpc::Status(grpc::StatusCode::UNAVAILABLE, "down")).reason() == "SERVER_UNAVAILABLE");
}

TEST(retry_policy_is_connection_failures_only) {
  for (auto c : {StatusCode::UNAVAILABLE, StatusCode::CANCELLED, StatusCode::UNKNOWN, StatusCode::DEADLINE_EXCEEDED})
    CHECK(retryable(c));
  for (auto c : {StatusCode::INVALID_ARGUMENT, StatusCode::RESOURCE_EXHAUSTED, StatusCode::NOT_FOUND,
                 StatusCode::FAILED_PRECONDITION, StatusCode::INTERNAL, StatusCode::ALREADY_EXISTS})
    CHECK(!retryable(c));
}

TEST(backoff_doubles_up_to_its_cap_within_its_patience) {
  double now = 100.0;
  std::vector<double> slept;
  Backoff b(2.0, 0.25, 1.0, [&] { return now; }, [&](double s) { slept.push_back(s); now += s; });
  while (b.wait()) {
  }
  CHECK(slept == std::vector<double>({0.25, 0.5, 1.0, 1.0}));  // 2.75 s > 2 s: no fifth attempt
  Backoff none(0.0, 0.05, 1.0, [&] { return now; }, [&](double s) { slept.push_back(s); });
  CHECK(!none.wait());
}

// ---------------------------------------------------------------- local policy

void add_linear(pb::PortablePolicy* msg, const Floats& w, const Floats& b, int64_t out, int64_t in) {
  auto* l = msg->add_layers();
  l->set_op("linear");
  fill_float_tensor(l->mutable_weight(), w, {out, in});
  fill_float_tensor(l->mutable_bias(), b, {out});
}

pb::PortablePolicy q_policy(double epsilon) {
  pb::PortablePolicy msg;
  msg.set_preprocessor("flatten");
  msg.set_version(7);
  space_to_proto(Space::Box({-1, -1}, {1, 1}), msg.mutable_observation_space());
  space_to_proto(Space::Discrete(3, 10), msg.mutable_action_space());
  // h = relu([x0 - x1, x1 - x0]); q = [h0, h1, 0.1]
  add_linear(&msg, {1, -1, -1, 1}, {0, 0}, 2, 2);
  msg.add_layers()->set_op("relu");
  add_linear(&msg, {1, 0, 0, 1, 0, 0}, {0, 0, 0.1f}, 3, 2);
  msg.mutable_head()->set_kind("q_argmax");
  msg.mutable_head()->add_branch_sizes(3);
  (*msg.mutable_head()->mutable_params())["epsilon"] = epsilon;
  return msg;
}

TEST(local_q_policy_is_greedy_with_its_start_and_explores_with_epsilon) {
  LocalPolicy greedy(q_policy(0.0).SerializeAsString());
  CHECK(greedy.version() == 7 && greedy.head_kind() == "q_argmax");
  CHECK(greedy.forward({0.5f, -0.5f}) == Floats({1.0f, 0.0f, 0.1f}));
  CHECK(greedy.act({0.5f, -0.5f}) == Floats({10}));
  CHECK(near(greedy.last_logp(), 0.0));
  CHECK(greedy.act({-0.5f, 0.5f}) == Floats({11}));
  CHECK(greedy.act({0.0f, 0.0f}) == Floats({12}));  // q = [0, 0, 0.1]
  LocalPolicy random(q_policy(1.0).SerializeAsString(), 3);
  std::set<float> seen;
  for (int i = 0; i < 200; ++i) seen.insert(random.act({0.5f, -0.5f})[0]);
  CHECK(seen == std::set<float>({10, 11, 12}));
  CHECK(near(random.last_logp(), std::log(1.0 / 3)));
  CHECK_THROWS_REASON(greedy.act({NAN, 0.0f}), "INVALID_VALUE");
}

TEST(local_q_policy_chooses_only_what_the_mask_allows) {
  pb::PortablePolicy msg;
  msg.set_preprocessor("flatten");
  space_to_proto(Space::Dict({"action_mask", "x"}, {Space::Box({0, 0}, {1, 1}), Space::Box({-1}, {1})}),
                 msg.mutable_observation_space());
  space_to_proto(Space::Discrete(2), msg.mutable_action_space());
  add_linear(&msg, {0, 0, 1, 0, 0, -1}, {0, 0}, 2, 3);  // q = [x, -x]
  msg.mutable_head()->set_kind("q_argmax");
  msg.mutable_head()->add_branch_sizes(2);
  (*msg.mutable_head()->mutable_params())["action_mask_offset"] = 0;
  LocalPolicy p(msg.SerializeAsString());
  CHECK(p.act({1, 1, 0.5f}) == Floats({0}));
  CHECK(p.act({0, 1, 0.5f}) == Floats({1}));   // the greedy action is masked out
  CHECK(p.act({0, 0, -0.5f}) == Floats({1}));  // nothing allowed: everything is
  (*msg.mutable_head()->mutable_params())["epsilon"] = 1.0;
  LocalPolicy explore(msg.SerializeAsString(), 1);
  for (int i = 0; i < 50; ++i) CHECK(explore.act({1, 0, 0.5f}) == Floats({0}));
}

TEST(local_gaussian_policy_scales_tanh_of_the_mean_into_the_box) {
  pb::PortablePolicy msg;
  msg.set_preprocessor("flatten");
  space_to_proto(Space::Box({-1}, {1}), msg.mutable_observation_space());
  space_to_proto(Space::Box({0, -2}, {4, 2}), msg.mutable_action_space());
  add_linear(&msg, {1, 2, 0, 0}, {0, 0, -1, 5}, 4, 1);  // [mean0 = x, mean1 = 2x, log_std -1, 5]
  msg.mutable_head()->set_kind("tanh_gaussian");
  auto& params = *msg.mutable_head()->mutable_params();
  params["deterministic"] = 1;
  LocalPolicy p(msg.SerializeAsString());
  Floats a = p.act({0.5f});
  CHECK(near(a[0], 0 + (std::tanh(0.5) + 1) * 2) && near(a[1], -2 + (std::tanh(1.0) + 1) * 2));
  CHECK(std::isnan(p.last_logp()));
  params["deterministic"] = 0;
  params["log_std_max"] = -20;  // no noise left: the sample is the mean
  params["log_std_min"] = -30;
  LocalPolicy sampled(msg.SerializeAsString(), 5);
  Floats s = sampled.act({0.5f});
  CHECK(near(s[0], a[0], 1e-4) && near(s[1], a[1], 1e-4) && std::isfinite(sampled.last_logp()));
}

TEST(local_random_head_stays_in_its_space) {
  pb::PortablePolicy msg;
  msg.set_preprocessor("flatten");
  space_to_proto(Space::Box({-1}, {1}), msg.mutable_observation_space());
  space_to_proto(Space::MultiDiscrete({2, 5}, {1, -2}), msg.mutable_action_space());
  msg.mutable_head()->set_kind("random");
  LocalPolicy p(msg.SerializeAsString(), 9);
  for (int i = 0; i < 100; ++i) {
    Floats a = p.act({0});
    CHECK(a[0] >= 1 && a[0] <= 2 && a[1] >= -2 && a[1] <= 2);
  }
  CHECK(near(p.last_logp(), -std::log(10.0)));
}

TEST(local_policies_read_an_image_flattened_and_draw_integer_pixels) {
  pb::PortablePolicy msg;
  msg.set_preprocessor("flatten");
  space_to_proto(Space::Image({1, 2, 1}), msg.mutable_observation_space());
  space_to_proto(Space::Discrete(2), msg.mutable_action_space());
  add_linear(&msg, {1, -1, -1, 1}, {0, 0}, 2, 2);  // q = [p0 - p1, p1 - p0] on the pixels as 0..255
  msg.mutable_head()->set_kind("q_argmax");
  msg.mutable_head()->add_branch_sizes(2);
  LocalPolicy q(msg.SerializeAsString());
  CHECK(q.forward(flatten(q.observation_space(), {200, 10})) == Floats({190, -190}));
  CHECK(q.act({200, 10}) == Floats({0}) && q.act({10, 200}) == Floats({1}));
  pb::PortablePolicy random;
  random.set_preprocessor("flatten");
  space_to_proto(Space::Box({-1}, {1}), random.mutable_observation_space());
  space_to_proto(Space::Image({3}), random.mutable_action_space());
  random.mutable_head()->set_kind("random");
  LocalPolicy r(random.SerializeAsString(), 4);
  for (int i = 0; i < 50; ++i)
    for (float p : r.act({0}))
      CHECK(p >= 0 && p <= 255 && std::nearbyint(p) == p);
  random.mutable_head()->set_kind("tanh_gaussian");  // squashed floats are no pixels
  add_linear(&random, Floats(6, 0.0f), Floats(6, 0.0f), 6, 1);
  CHECK_THROWS_REASON(LocalPolicy(random.SerializeAsString()), "INVALID_VALUE");
}

TEST(malformed_portable_policies_are_refused) {
  CHECK_THROWS_REASON(LocalPolicy("\xff\xff garbage"), "INVALID_VALUE");
  pb::PortablePolicy msg = q_policy(0.0);
  msg.mutable_layers(1)->set_op("gelu");
  CHECK_THROWS_REASON(LocalPolicy(msg.SerializeAsString()), "INVALID_VALUE");
  msg = q_policy(0.0);
  msg.mutable_head()->set_branch_sizes(0, 4);  // the action space has 3
  CHECK_THROWS_REASON(LocalPolicy(msg.SerializeAsString()), "INVALID_VALUE");
  msg = q_policy(0.0);
  add_linear(&msg, {1, 1}, {0}, 1, 2);  // 3 outputs do not feed a 2-input layer
  CHECK_THROWS_REASON(LocalPolicy(msg.SerializeAsString()), "INVALID_VALUE");
  msg = q_policy(0.0);
  msg.set_preprocessor("image");
  CHECK_THROWS_REASON(LocalPolicy(msg.SerializeAsString()), "INVALID_VALUE");
  msg = q_policy(0.0);
  (*msg.mutable_head()->mutable_params())["epsilon"] = 1.5;
  CHECK_THROWS_REASON(LocalPolicy(msg.SerializeAsString()), "INVALID_VALUE");
}

// ---------------------------------------------------------------- credentials

std::string temp_file(const std::string& text) {
  char path[] = "/tmp/simbridge_unit_XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) throw std::runtime_error("mkstemp failed");
  close(fd);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

TEST(the_token_comes_from_the_option_then_its_file_then_the_environment) {
  std::string file = temp_file("  from-file\n");
  ::setenv("SIMBRIDGE_AUTH_TOKEN", "from-env", 1);
  ClientOptions o;
  CHECK(Credentials(o).authorization() == "Bearer from-env");
  o.auth_token_file = file;
  CHECK(Credentials(o).authorization() == "Bearer from-file");  // surrounding whitespace stripped
  o.auth_token = "from-option";
  CHECK(Credentials(o).authorization() == "Bearer from-option");
  ::unsetenv("SIMBRIDGE_AUTH_TOKEN");
  CHECK(Credentials(ClientOptions{}).authorization().empty());
  CHECK(!Credentials(ClientOptions{}).tls());
  std::remove(file.c_str());
}

TEST(bad_token_and_pem_files_are_named_before_connecting) {
  ClientOptions o;
  o.auth_token_file = "/nonexistent/token";
  CHECK(error_message([&] { Credentials c(o); }).find("auth_token_file '/nonexistent/token': cannot read it") !=
        std::string::npos);
  std::string empty = temp_file(" \n"), two_lines = temp_file("tok\nen\n"), not_pem = temp_file("tok");
  o.auth_token_file = empty;
  CHECK_THROWS_REASON(Credentials c(o), "INVALID_REQUEST");
  CHECK(error_message([&] { Credentials c(o); }).find("holds no token") != std::string::npos);
  o.auth_token_file = two_lines;  // a newline inside would break every call's metadata
  CHECK(error_message([&] { Credentials c(o); }).find("not printable ASCII") != std::string::npos);
  ClientOptions t;
  t.tls_ca_file = not_pem;
  CHECK(error_message([&] { Credentials c(t); }).find("not a PEM file") != std::string::npos);
  ClientOptions half;
  half.tls_cert_file = not_pem;  // a certificate without its key
  CHECK(error_message([&] { Credentials c(half); }).find("go together") != std::string::npos);
  for (const auto& f : {empty, two_lines, not_pem}) std::remove(f.c_str());
}

TEST(no_trainer_within_the_connect_timeout_names_the_trainer_to_start) {
  // As the Python SDK says it: the fix is a trainer, not the random-policy simbridge-server.
  ClientOptions o;
  Credentials creds(o);
  grpc::ChannelArguments args;
  creds.configure(args);
  const std::string address = "127.0.0.1:1";  // nothing listens on port 1
  auto channel = grpc::CreateCustomChannel(address, creds.channel(), args);
  const std::string message = error_message([&] { wait_connected(channel, creds, address, 0.3); });
  CHECK(message.find("no simbridge trainer at 127.0.0.1:1 within") != std::string::npos);
  CHECK(message.find("start one with `simbridge-trainer run --address 127.0.0.1:1`") != std::string::npos);
  CHECK(message.find("simbridge-server") == std::string::npos);
}

TEST(tls_is_on_when_any_tls_option_is_set) {
  ClientOptions o;
  o.tls_server_name = "bridge.example";  // the system's roots then
  Credentials c(o);
  CHECK(c.tls() && c.trust() == "the system's root certificates");
}

TEST(client_flags_set_their_options_and_only_theirs) {
  ClientOptions o;
  CHECK(set_client_flag(o, "--tls-ca", "ca.pem") && o.tls_ca_file == "ca.pem");
  CHECK(set_client_flag(o, "--tls-cert", "c.pem") && o.tls_cert_file == "c.pem");
  CHECK(set_client_flag(o, "--tls-key", "k.pem") && o.tls_key_file == "k.pem");
  CHECK(set_client_flag(o, "--tls-server-name", "n") && o.tls_server_name == "n");
  CHECK(set_client_flag(o, "--auth-token-file", "t") && o.auth_token_file == "t");
  CHECK(!set_client_flag(o, "--address", "x") && !set_client_flag(o, "--auth-token", "secret"));
  CHECK(o.auth_token.empty());
}

}  // namespace

int main() { return run_all_tests(); }
