#include "base/parse.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace commlib {

bool parse_int(const std::string& text, int64_t* out, std::string* why) {
  const char* s = text.c_str();
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(s, &end, 10);
  if (end == s || *end != '\0') {
    *why = "not an integer";
    return false;
  }
  if (errno == ERANGE) {
    *why = "out of range";
    return false;
  }
  *out = int64_t(x);
  return true;
}

bool parse_double(const std::string& text, double* out, std::string* why) {
  const char* s = text.c_str();
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(s, &end);
  if (end == s || *end != '\0') {
    *why = "not a number";
    return false;
  }
  // (an underflow, as 1e-400, is the nearest representable value, 0 or
  // subnormal, which the variable's own range check then judges)
  if (!std::isfinite(x) || (errno == ERANGE && std::fabs(x) >= 1.0)) {
    *why = "not a finite number";
    return false;
  }
  *out = x;
  return true;
}

bool parse_bool(const std::string& text, bool* out, std::string* why) {
  if (text == "0" || text == "1") {
    *out = text == "1";
    return true;
  }
  *why = "not 0 or 1";
  return false;
}

bool parse_choice(const std::string& text, const std::string& choices, std::string* why) {
  size_t start = 0;
  for (;;) {
    const size_t bar = choices.find('|', start);
    const size_t stop = bar == std::string::npos ? choices.size() : bar;
    if (choices.compare(start, stop - start, text) == 0) return true;
    if (bar == std::string::npos) break;
    start = bar + 1;
  }
  *why = "not one of " + list_choices(choices);
  return false;
}

std::string list_choices(const std::string& choices) {
  std::string out;
  for (char c : choices) {
    if (c == '|') {
      out += ", ";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace commlib
