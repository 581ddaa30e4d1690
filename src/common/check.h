// MEMENTO_CHECK: aborts with file:line when an internal invariant is broken.
// Never use it on input from a caller, a file or the network: that is a Status.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace memento::internal {
[[noreturn]] inline void CheckFailed(const char* file, int line, const char* expr,
                                     const char* msg) {
  std::fprintf(stderr, "memento: %s:%d: check failed: %s%s%s\n", file, line, expr,
               msg[0] ? ": " : "", msg);
  std::fflush(stderr);
  std::abort();
}
}  // namespace memento::internal

#define MEMENTO_CHECK(cond)                                            \
  do {                                                                 \
    if (__builtin_expect(!(cond), 0))                                  \
      ::memento::internal::CheckFailed(__FILE__, __LINE__, #cond, ""); \
  } while (0)

#define MEMENTO_CHECK_MSG(cond, msg)                                      \
  do {                                                                    \
    if (__builtin_expect(!(cond), 0))                                     \
      ::memento::internal::CheckFailed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)

// Checks that a Status-returning expression succeeded (internal calls only).
#define MEMENTO_CHECK_OK(expr)                                                    \
  do {                                                                            \
    ::memento::Status memento_check_status_ = (expr);                             \
    if (!memento_check_status_.ok())                                              \
      ::memento::internal::CheckFailed(__FILE__, __LINE__, #expr,                 \
                                       memento_check_status_.ToString().c_str()); \
  } while (0)
