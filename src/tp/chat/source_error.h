#pragma once
// Errors that point into a template: "chat template 'NAME' line L, column C: what".
#include <fmt/format.h>

#include <string>
#include <string_view>

namespace tp::chat {

// Where an offset is, 1-based; columns count code points.
struct SourcePosition {
  size_t line, column;
};
SourcePosition position_of(std::string_view source, size_t offset);

// A template (its text and the name errors give it).
struct SourceRef {
  std::string_view source;
  std::string_view name;
};

[[noreturn]] void fail_at(const SourceRef& ref, size_t offset, const std::string& what);

template <class... Args>
[[noreturn]] void fail_at(const SourceRef& ref, size_t offset, fmt::format_string<Args...> format, Args&&... args) {
  fail_at(ref, offset, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace tp::chat
