#include "params.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace simbridge_gz {
namespace params {

void bad(const std::string& key, const std::string& why) {
  throw std::invalid_argument("simbridge gazebo parameter <" + key + ">: " + why);
}

// Lists in SDF text are separated by spaces or commas.
std::vector<std::string> split(const std::string& text) {
  std::string spaced = text;
  std::replace(spaced.begin(), spaced.end(), ',', ' ');
  std::istringstream in(spaced);
  std::vector<std::string> out;
  for (std::string word; in >> word;) out.push_back(word);
  return out;
}

std::string trimmed(const std::string& text) {
  const auto words = split(text);
  if (words.size() != 1) return text;   // let the caller complain about the whole text
  return words[0];
}

double to_double(const std::string& key, const std::string& word) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(word, &used);
  } catch (const std::exception&) {
    bad(key, "'" + word + "' is not a number");
  }
  if (used != word.size() || std::isnan(value)) bad(key, "'" + word + "' is not a number");
  return value;
}

int64_t to_int(const std::string& key, const std::string& text, int64_t min) {
  const std::string word = trimmed(text);
  size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(word, &used);
  } catch (const std::exception&) {
    bad(key, "'" + text + "' is not an integer");
  }
  if (used != word.size()) bad(key, "'" + text + "' is not an integer");
  if (value < min) bad(key, "must be >= " + std::to_string(min) + ", got " + word);
  return value;
}

std::vector<double> to_doubles(const std::string& key, const std::string& text) {
  std::vector<double> out;
  for (const auto& word : split(text)) out.push_back(to_double(key, word));
  return out;
}

bool to_bool(const std::string& key, const std::string& text) {
  const std::string word = trimmed(text);
  if (word == "true" || word == "1") return true;
  if (word == "false" || word == "0") return false;
  bad(key, "'" + text + "' is not true/false");
}

// Seconds a wait or an age may take: bounded (a million seconds, 11 days), so that a huge value
// neither overflows sim-time nanoseconds nor turns a wait into none (wait_for's clock overflows too).
double to_seconds(const std::string& key, const std::string& text, bool zero_allowed) {
  const double value = to_double(key, trimmed(text));
  if (!(value <= 1e6) || value < 0 || (!zero_allowed && value == 0))
    bad(key, zero_allowed ? "must be >= 0 and at most 1e6" : "must be > 0 and at most 1e6");
  return value;
}

}  // namespace params
}  // namespace simbridge_gz
