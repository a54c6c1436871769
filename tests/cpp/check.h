// A tiny header-only check framework for the C++ unit tests of the core.
//
//   TEST_CASE(name) { CHECK(cond); CHECK_EQ(a, b); CHECK_THROWS(expr); }
//   int main() { return commlib_test::run_all(); }   // via CHECK_MAIN()
//
// Checks do not stop a test case; each failure is printed with file:line and
// counted, and main returns 1 when any check failed (or a case threw). Every
// test binary may define main with CHECK_MAIN(); a case name filter can be
// passed as the first argument (substring match).
#pragma once

#include <cstdio>
#include <cstring>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

namespace commlib_test {

struct Case {
  const char* name;
  void (*fn)();
};

inline std::vector<Case>& registry() {
  static std::vector<Case> cases;
  return cases;
}

inline int& failures() {
  static int n = 0;
  return n;
}

inline int& checks() {
  static int n = 0;
  return n;
}

struct Registrar {
  Registrar(const char* name, void (*fn)()) { registry().push_back({name, fn}); }
};

inline void fail(const char* file, int line, const std::string& what) {
  ++failures();
  std::fprintf(stderr, "%s:%d: FAILED: %s\n", file, line, what.c_str());
}

// Printable form of a value for CHECK_EQ messages.
template <typename T>
std::string show(const T& v) {
  std::ostringstream s;
  s << v;
  return s.str();
}
inline std::string show(const std::string& v) {
  std::string out = "\"";
  for (char c : v) out += c == '\0' ? std::string("\\0") : std::string(1, c);
  return out + "\"";
}
inline std::string show(const char* v) { return v ? show(std::string(v)) : "(null)"; }
inline std::string show(bool v) { return v ? "true" : "false"; }
template <typename T>
std::string show(const std::vector<T>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + show(v[i]);
  return out + "]";
}

inline int run_all(int argc = 0, char** argv = nullptr) {
  const char* filter = argc > 1 ? argv[1] : nullptr;
  int ran = 0, failed_cases = 0;
  for (const Case& c : registry()) {
    if (filter && !std::strstr(c.name, filter)) continue;
    const int before = failures();
    try {
      c.fn();
    } catch (const std::exception& e) {
      fail(__FILE__, __LINE__, std::string("case '") + c.name + "' threw: " + e.what());
    } catch (...) {
      fail(__FILE__, __LINE__, std::string("case '") + c.name + "' threw a non-exception");
    }
    ++ran;
    const bool ok = failures() == before;
    if (!ok) ++failed_cases;
    std::printf("%s %s\n", ok ? "ok    " : "FAILED", c.name);
  }
  std::printf("%d cases, %d failed, %d checks, %d failed checks\n", ran, failed_cases, checks(),
              failures());
  if (ran == 0) {
    std::fprintf(stderr, "no test case ran\n");
    return 1;
  }
  return failures() ? 1 : 0;
}

}  // namespace commlib_test

#define CHECK_CAT2(a, b) a##b
#define CHECK_CAT(a, b) CHECK_CAT2(a, b)

#define TEST_CASE(name)                                                              \
  static void CHECK_CAT(test_fn_, __LINE__)();                                       \
  static const commlib_test::Registrar CHECK_CAT(test_reg_, __LINE__)(               \
      name, &CHECK_CAT(test_fn_, __LINE__));                                         \
  static void CHECK_CAT(test_fn_, __LINE__)()

#define CHECK(cond)                                                                  \
  do {                                                                               \
    ++commlib_test::checks();                                                        \
    if (!(cond)) commlib_test::fail(__FILE__, __LINE__, "CHECK(" #cond ")");         \
  } while (0)

#define CHECK_EQ(a, b)                                                               \
  do {                                                                               \
    ++commlib_test::checks();                                                        \
    /* copies: (a) may be a reference into a temporary */                           \
    const auto check_a_ = (a);                                                       \
    const auto check_b_ = (b);                                                       \
    if (!(check_a_ == check_b_))                                                     \
      commlib_test::fail(__FILE__, __LINE__,                                         \
                         "CHECK_EQ(" #a ", " #b "): " + commlib_test::show(check_a_) + \
                             " != " + commlib_test::show(check_b_));                 \
  } while (0)

// expr must throw an exception of type E.
#define CHECK_THROWS(E, expr)                                                        \
  do {                                                                               \
    ++commlib_test::checks();                                                        \
    bool check_threw_ = false;                                                       \
    try {                                                                            \
      (void)(expr);                                                                  \
    } catch (const E&) {                                                             \
      check_threw_ = true;                                                           \
    } catch (...) {                                                                  \
    }                                                                                \
    if (!check_threw_)                                                               \
      commlib_test::fail(__FILE__, __LINE__, "CHECK_THROWS(" #E ", " #expr ")");     \
  } while (0)

// Checks that `haystack` (a std::string) contains `needle`.
#define CHECK_CONTAINS(haystack, needle)                                             \
  do {                                                                               \
    ++commlib_test::checks();                                                        \
    const std::string check_h_ = (haystack);                                         \
    const std::string check_n_ = (needle);                                           \
    if (check_h_.find(check_n_) == std::string::npos)                                \
      commlib_test::fail(__FILE__, __LINE__,                                         \
                         "CHECK_CONTAINS(" #haystack ", " #needle "): " +            \
                             commlib_test::show(check_h_) + " lacks " +              \
                             commlib_test::show(check_n_));                          \
  } while (0)

#define CHECK_MAIN() \
  int main(int argc, char** argv) { return commlib_test::run_all(argc, argv); }
