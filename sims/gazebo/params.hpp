// The plugin's parameters as SDF gives them, text, into values: each function throws
// std::invalid_argument naming the parameter (`<key>`) and why.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace simbridge_gz {
namespace params {

[[noreturn]] void bad(const std::string& key, const std::string& why);
// Lists in SDF text are separated by spaces or commas.
std::vector<std::string> split(const std::string& text);
// The one word of `text`, or `text` as it is when it is not one word (for the caller to refuse).
std::string trimmed(const std::string& text);
double to_double(const std::string& key, const std::string& word);
int64_t to_int(const std::string& key, const std::string& text, int64_t min);
std::vector<double> to_doubles(const std::string& key, const std::string& text);
bool to_bool(const std::string& key, const std::string& text);
// Seconds, finite, at most 1e6, > 0 (or >= 0 where zero_allowed).
double to_seconds(const std::string& key, const std::string& text, bool zero_allowed);

}  // namespace params
}  // namespace simbridge_gz
