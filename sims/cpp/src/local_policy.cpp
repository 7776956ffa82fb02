// LocalPolicy: a PortablePolicy run in plain C++, computing what simbridge/client/local_policy.py
// computes (the layers in float32; the heads' arithmetic in double, as numpy does there).
#include <algorithm>
#include <cmath>
#include <random>

#include "wire.hpp"

namespace simbridge {

namespace {

Error format_error(const std::string& message) { return invalid_value("PortablePolicy: " + message); }

struct Layer {
  enum class Op { Linear, Relu, Tanh } op;
  size_t in = 0, out = 0;
  Floats weight, bias;  // weight (out, in), row-major
};

double param(const pb::ActionHead& head, const std::string& key, double fallback) {
  auto it = head.params().find(key);
  return it == head.params().end() ? fallback : it->second;
}

}  // namespace

struct LocalPolicy::Impl {
  std::string policy_id, kind;
  int64_t version = 0;
  Space obs_space, act_space;
  size_t in_dim = 0, out_dim = 0;
  std::vector<Layer> layers;
  std::mt19937_64 rng;
  double last_logp = NAN;
  // q_argmax
  std::vector<int64_t> nvec, start;
  double epsilon = 0;
  int64_t mask_offset = -1;
  // tanh_gaussian
  std::vector<double> low, high, scale;
  double log_scale_sum = 0, log_std_min = -20, log_std_max = 2;
  bool squash = false, deterministic = false;

  double uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng); }
  int64_t below(int64_t n) { return std::uniform_int_distribution<int64_t>(0, n - 1)(rng); }

  void check_out(size_t expected) const {
    if (layers.empty()) throw format_error("head '" + kind + "' needs layers");
    if (out_dim != expected)
      throw format_error("the layers give " + std::to_string(out_dim) + " outputs; head '" + kind + "' needs " +
                         std::to_string(expected));
  }

  Floats forward(const Floats& flat) const {
    if (flat.size() != in_dim)
      throw invalid_value("expected " + std::to_string(in_dim) + " preprocessed features, got " + std::to_string(flat.size()));
    Floats x = flat, y;
    for (const auto& l : layers) {
      switch (l.op) {
        case Layer::Op::Linear:
          y.assign(l.out, 0.0f);
          for (size_t o = 0; o < l.out; ++o) {
            const float* w = l.weight.data() + o * l.in;
            float acc = 0.0f;
            for (size_t i = 0; i < l.in; ++i) acc += w[i] * x[i];
            y[o] = acc + l.bias[o];
          }
          x.swap(y);
          break;
        case Layer::Op::Relu:
          for (float& v : x) v = v > 0.0f ? v : 0.0f;
          break;
        case Layer::Op::Tanh:
          for (float& v : x) v = std::tanh(v);
          break;
      }
    }
    return x;
  }

  Floats q_argmax(const Floats& q, const Floats& flat) {
    const size_t branches = nvec.size();
    Floats action(branches);
    std::vector<size_t> greedy(branches), chosen(branches);
    double p_random = epsilon;
    const bool explore = epsilon > 0 && uniform() < epsilon;
    size_t offset = 0;
    for (size_t b = 0; b < branches; ++b) {
      const size_t k = static_cast<size_t>(nvec[b]);
      // Allowed actions of this branch (mask columns > 0.5; a branch allowing none allows all).
      std::vector<bool> ok(k, true);
      if (mask_offset >= 0) {
        bool any = false;
        for (size_t j = 0; j < k; ++j) any |= (ok[j] = flat[mask_offset + offset + j] > 0.5f);
        if (!any) std::fill(ok.begin(), ok.end(), true);
      }
      size_t best = k, allowed = 0;
      for (size_t j = 0; j < k; ++j) {
        if (!ok[j]) continue;
        ++allowed;
        if (best == k || q[offset + j] > q[offset + best]) best = j;  // the first of equal maxima, as argmax
      }
      greedy[b] = chosen[b] = best;
      if (explore) {
        int64_t pick = below(static_cast<int64_t>(allowed));
        for (size_t j = 0; j < k; ++j)
          if (ok[j] && pick-- == 0) {
            chosen[b] = j;
            break;
          }
      }
      p_random /= static_cast<double>(allowed);
      action[b] = static_cast<float>(static_cast<int64_t>(chosen[b]) + start[b]);
      offset += k;
    }
    last_logp = std::log(p_random + (chosen == greedy ? 1.0 - epsilon : 0.0));
    return action;
  }

  double log_std_of(double raw) const {
    if (squash) raw = log_std_min + 0.5 * (log_std_max - log_std_min) * (std::tanh(raw) + 1.0);
    return std::min(std::max(raw, log_std_min), log_std_max);
  }

  Floats tanh_gaussian(const Floats& out) {
    const size_t a = low.size();
    Floats action(a);
    double logp = 0;
    std::normal_distribution<double> normal(0.0, 1.0);
    for (size_t i = 0; i < a; ++i) {
      double mean = out[i], log_std = log_std_of(out[a + i]), t;
      if (deterministic) {
        t = std::tanh(mean);
      } else {
        double noise = normal(rng), u = mean + std::exp(log_std) * noise;
        t = std::tanh(u);
        // log(1 - tanh(u)^2), stable: 2 (log 2 - u - softplus(-2u))
        double softplus = std::max(-2.0 * u, 0.0) + std::log1p(std::exp(-std::abs(2.0 * u)));
        logp += -0.5 * noise * noise - log_std - 0.5 * std::log(2 * M_PI) - 2.0 * (std::log(2.0) - u - softplus);
      }
      action[i] = static_cast<float>(std::min(std::max(low[i] + (t + 1.0) * scale[i], low[i]), high[i]));
    }
    last_logp = deterministic ? NAN : logp - log_scale_sum;
    return action;
  }

  Floats random_action() {
    const Space& sp = act_space;
    Floats action;
    double logp = 0;
    switch (sp.kind) {
      case Space::Kind::Discrete:
        action.push_back(static_cast<float>(sp.start + below(sp.n)));
        logp = -std::log(static_cast<double>(sp.n));
        break;
      case Space::Kind::MultiDiscrete:
        for (size_t i = 0; i < sp.nvec.size(); ++i) {
          action.push_back(static_cast<float>(sp.starts[i] + below(sp.nvec[i])));
          logp -= std::log(static_cast<double>(sp.nvec[i]));
        }
        break;
      case Space::Kind::MultiBinary:
        for (size_t i = 0; i < sp.size(); ++i) action.push_back(static_cast<float>(below(2)));
        logp = NAN;
        break;
      case Space::Kind::Box:
        for (size_t i = 0; i < sp.size(); ++i) {
          double lo = sp.low[i], hi = sp.high[i];
          if (sp.dtype == Space::DType::UInt8) {  // integers, as gymnasium samples an integer Box
            action.push_back(static_cast<float>(lo + static_cast<double>(below(static_cast<int64_t>(hi - lo) + 1))));
            logp = NAN;
          } else if (std::isfinite(lo) && std::isfinite(hi)) {
            action.push_back(static_cast<float>(lo + (hi - lo) * uniform()));
            logp -= hi > lo ? std::log(hi - lo) : NAN;
          } else {  // unbounded sides as gymnasium samples them: normal, or shifted exponential
            std::normal_distribution<double> normal(0.0, 1.0);
            std::exponential_distribution<double> expo(1.0);
            double v = std::isfinite(lo) ? lo + expo(rng) : std::isfinite(hi) ? hi - expo(rng) : normal(rng);
            action.push_back(static_cast<float>(v));
            logp = NAN;
          }
        }
        break;
      default: throw format_error("a random head needs a Box, Discrete, MultiDiscrete or MultiBinary action space");
    }
    last_logp = logp;
    return action;
  }
};

LocalPolicy::LocalPolicy(const std::string& serialized, uint64_t seed) : impl_(std::make_unique<Impl>()) {
  pb::PortablePolicy msg;
  if (!msg.ParseFromString(serialized)) throw format_error("the bytes are not a serialized PortablePolicy");
  Impl& p = *impl_;
  p.rng.seed(seed);
  p.policy_id = msg.policy_id();
  p.version = msg.version();
  p.obs_space = space_from_proto(msg.observation_space(), "observation_space");
  p.act_space = space_from_proto(msg.action_space(), "action_space");
  if (msg.preprocessor() != "flatten") throw format_error("unknown preprocessor '" + msg.preprocessor() + "' (known: flatten)");
  p.kind = msg.head().kind();
  p.in_dim = p.obs_space.flat_size();
  size_t dim = p.in_dim;
  for (int i = 0; i < msg.layers_size(); ++i) {
    const auto& l = msg.layers(i);
    Layer layer;
    if (l.op() == "linear") {
      layer.op = Layer::Op::Linear;
      layer.weight = tensor_floats(l.weight(), "layer " + std::to_string(i) + " weight");
      layer.bias = tensor_floats(l.bias(), "layer " + std::to_string(i) + " bias");
      if (l.weight().shape_size() != 2 || static_cast<size_t>(l.weight().shape(1)) != dim ||
          l.bias().shape_size() != 1 || l.bias().shape(0) != l.weight().shape(0))
        throw format_error("layer " + std::to_string(i) + ": linear weight and bias do not fit an input of " +
                           std::to_string(dim) + " features (weight is (out, in))");
      layer.in = dim;
      layer.out = dim = static_cast<size_t>(l.weight().shape(0));
    } else if (l.op() == "relu") {
      layer.op = Layer::Op::Relu;
    } else if (l.op() == "tanh") {
      layer.op = Layer::Op::Tanh;
    } else {
      throw format_error("layer " + std::to_string(i) + ": unknown op '" + l.op() + "' (known: linear, relu, tanh)");
    }
    p.layers.push_back(std::move(layer));
  }
  p.out_dim = dim;
  const auto& head = msg.head();
  const Space& sp = p.act_space;
  if (p.kind == "q_argmax") {
    if (sp.kind == Space::Kind::Discrete) {
      p.nvec = {sp.n};
      p.start = {sp.start};
    } else if (sp.kind == Space::Kind::MultiDiscrete) {
      p.nvec = sp.nvec;
      p.start = sp.starts;
    } else {
      throw format_error("q_argmax needs a Discrete or MultiDiscrete action space");
    }
    if (std::vector<int64_t>(head.branch_sizes().begin(), head.branch_sizes().end()) != p.nvec)
      throw format_error("q_argmax branch_sizes do not match the action space");
    size_t total = 0;
    for (int64_t k : p.nvec) total += static_cast<size_t>(k);
    p.check_out(total);
    p.epsilon = param(head, "epsilon", 0.0);
    if (!(p.epsilon >= 0.0 && p.epsilon <= 1.0)) throw format_error("q_argmax epsilon is outside [0, 1]");
    double off = param(head, "action_mask_offset", -1.0);
    if (off >= 0) {
      p.mask_offset = static_cast<int64_t>(off);
      if (p.mask_offset + total > p.in_dim)
        throw format_error("q_argmax action_mask_offset: the mask's columns do not fit the observation features");
    }
  } else if (p.kind == "tanh_gaussian") {
    if (sp.kind != Space::Kind::Box || sp.dtype != Space::DType::Float32)
      throw format_error("tanh_gaussian needs a float32 Box action space");
    for (size_t i = 0; i < sp.low.size(); ++i) {
      double lo = sp.low[i], hi = sp.high[i];
      if (!std::isfinite(lo) || !std::isfinite(hi)) throw format_error("tanh_gaussian needs finite Box bounds");
      p.low.push_back(lo);
      p.high.push_back(hi);
      p.scale.push_back((hi - lo) / 2.0);
      p.log_scale_sum += std::log((hi - lo) / 2.0);
    }
    p.check_out(2 * p.low.size());
    p.log_std_min = param(head, "log_std_min", -20.0);
    p.log_std_max = param(head, "log_std_max", 2.0);
    p.squash = param(head, "log_std_squash", 0.0) != 0.0;
    p.deterministic = param(head, "deterministic", 0.0) != 0.0;
  } else if (p.kind == "random") {
    if (!p.layers.empty()) throw format_error("a random head takes no layers");
  } else {
    throw format_error("unknown action head '" + p.kind + "' (known: q_argmax, tanh_gaussian, random)");
  }
}

LocalPolicy::~LocalPolicy() = default;
LocalPolicy::LocalPolicy(LocalPolicy&&) noexcept = default;
LocalPolicy& LocalPolicy::operator=(LocalPolicy&&) noexcept = default;

Floats LocalPolicy::forward(const Floats& flat_observation) const { return impl_->forward(flat_observation); }

Floats LocalPolicy::act(const Floats& observation) {
  Impl& p = *impl_;
  Floats flat = flatten(p.obs_space, observation);
  for (float v : flat)
    if (std::isnan(v)) throw invalid_value("observation contains NaN");
  if (p.kind == "random") return p.random_action();
  Floats out = p.forward(flat);
  for (float v : out)
    if (std::isnan(v)) throw invalid_value("the policy's output is NaN");
  return p.kind == "q_argmax" ? p.q_argmax(out, flat) : p.tanh_gaussian(out);
}

Action LocalPolicy::act_typed(const Floats& observation) { return to_action(impl_->act_space, act(observation)); }

double LocalPolicy::last_logp() const { return impl_->last_logp; }
const Space& LocalPolicy::observation_space() const { return impl_->obs_space; }
const Space& LocalPolicy::action_space() const { return impl_->act_space; }
const std::string& LocalPolicy::policy_id() const { return impl_->policy_id; }
int64_t LocalPolicy::version() const { return impl_->version; }
const std::string& LocalPolicy::head_kind() const { return impl_->kind; }

}  // namespace simbridge
