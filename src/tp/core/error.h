#pragma once
// Errors: every failure the user can cause is a tp::Error whose message names the
// offending value and what would be accepted. The CLI prints it as
// "[rank r] error: ..." and exits 1 (UsageError: exit 2).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <string>

namespace tp {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad command-line usage (exit code 2 instead of 1).
class UsageError : public Error {
 public:
  using Error::Error;
};

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace tp

// TP_CHECK(cond, "format {}", value): throws tp::Error with the formatted message.
#define TP_CHECK(cond, ...)            \
  do {                                 \
    if (!(cond)) ::tp::fail(__VA_ARGS__); \
  } while (0)
