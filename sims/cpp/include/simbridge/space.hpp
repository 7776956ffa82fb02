// Spaces (gymnasium's, as proto/simbridge/v1/simbridge.proto carries them) and the rows of floats
// that carry their values.
//
// One row is the leaves of the space's value concatenated in space order (Dict in declared order,
// Tuple in order), each leaf row-major; a Discrete leaf is one value, its index (start included).
// Batched calls take N rows back to back. Integer leaves typed as integers: action.hpp.
//
// A camera is a uint8 Box (Space::Image): its row holds the pixels as floats 0..255, and they
// travel as bytes, so the trainer keeps them as bytes and its convolutional encoders read them
// (docs/engines.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace simbridge {

using Floats = std::vector<float>;
using Ints = std::vector<int64_t>;

struct Space {
  enum class Kind { Box, Discrete, MultiDiscrete, MultiBinary, Dict, Tuple };
  // A Box's element type on the wire (gymnasium's Box dtype): float32, or uint8 for images.
  enum class DType { Float32, UInt8 };
  Kind kind = Kind::Box;
  DType dtype = DType::Float32;        // Box
  Floats low, high;                    // Box: bounds, row-major
  std::vector<int64_t> shape;          // Box, MultiBinary
  int64_t n = 0, start = 0;            // Discrete
  std::vector<int64_t> nvec, starts;   // MultiDiscrete (flat, shape (nvec.size(),))
  std::vector<Space> children;         // Dict (with names) and Tuple
  std::vector<std::string> names;

  static Space Box(Floats low, Floats high);  // 1-D float32 box, shape (low.size(),)
  static Space Box(Floats low, Floats high, std::vector<int64_t> shape);
  // A uint8 Box of bounds 0 and 255, of any shape: a camera's image is rank 3, HWC (e.g. {84, 84, 3})
  // or CHW (the trainer's encoders take rank 3 only). Its values must be integers in [0, 255] (Error
  // INVALID_VALUE naming the leaf and the value).
  static Space Image(std::vector<int64_t> shape);
  static Space Discrete(int64_t n, int64_t start = 0);
  static Space MultiDiscrete(std::vector<int64_t> nvec, std::vector<int64_t> start = {});
  static Space MultiBinary(std::vector<int64_t> shape);
  static Space Dict(std::vector<std::string> names, std::vector<Space> spaces);
  static Space Tuple(std::vector<Space> spaces);

  size_t size() const;       // values in one row
  size_t flat_size() const;  // features after flatten()
  size_t int_size() const;   // of size(), those in integer leaves (Discrete, MultiDiscrete, MultiBinary)
};

// gymnasium.spaces.flatten of one row as float32: Box (uint8 too: pixels 0..255) and MultiBinary as
// they are, Discrete and MultiDiscrete one-hot from their start, Dict and Tuple concatenated in
// space order.
Floats flatten(const Space& space, const Floats& row);

}  // namespace simbridge
