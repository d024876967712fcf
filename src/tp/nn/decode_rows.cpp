#include "tp/nn/decode_rows.h"

#include <utility>

namespace tp::nn {

namespace {
thread_local const DecodeRows* innermost = nullptr;
}  // namespace

DecodeRows::DecodeRows(std::vector<uint8_t> flags) : flags_(std::move(flags)), outer_(innermost) { innermost = this; }

DecodeRows::~DecodeRows() { innermost = outer_; }

std::span<const uint8_t> DecodeRows::for_rows(int64_t rows) {
  if (innermost == nullptr || static_cast<int64_t>(innermost->flags_.size()) != rows || rows == 0) return {};
  return innermost->flags_;
}

}  // namespace tp::nn
