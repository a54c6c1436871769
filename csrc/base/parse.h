// Strict parsing of configuration text: the whole text must be the value
// (no trailing garbage). Each returns false and sets *why to a short reason
// ("not an integer", "out of range") when the text is not a value.
#pragma once

#include <cstdint>
#include <string>

namespace commlib {

// A base-10 integer that fits int64_t (leading blanks and a sign allowed,
// as strtoll reads them).
bool parse_int(const std::string& text, int64_t* out, std::string* why);
// A finite decimal floating-point number.
bool parse_double(const std::string& text, double* out, std::string* why);
// Exactly "0" or "1".
bool parse_bool(const std::string& text, bool* out, std::string* why);
// One of the names in choices, separated by '|' ("auto|ring|tree").
bool parse_choice(const std::string& text, const std::string& choices, std::string* why);

// "auto|ring|tree" -> "auto, ring, tree".
std::string list_choices(const std::string& choices);

}  // namespace commlib
