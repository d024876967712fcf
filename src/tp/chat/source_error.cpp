#include "tp/chat/source_error.h"

#include "tp/core/error.h"

namespace tp::chat {

SourcePosition position_of(std::string_view source, size_t offset) {
  SourcePosition p{1, 1};
  for (size_t i = 0; i < offset && i < source.size(); ++i) {
    if (source[i] == '\n') {
      ++p.line;
      p.column = 1;
    } else if ((static_cast<unsigned char>(source[i]) & 0xC0) != 0x80) {
      ++p.column;
    }
  }
  return p;
}

void fail_at(const SourceRef& ref, size_t offset, const std::string& what) {
  const SourcePosition p = position_of(ref.source, offset);
  fail("chat template '{}' line {}, column {}: {}", ref.name, p.line, p.column, what);
}

}  // namespace tp::chat
