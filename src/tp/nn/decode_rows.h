#pragma once
// Which token rows of the forward in progress are decode steps (each a sequence's newest generated token, not a
// prompt's), for the layers whose kernels depend on it: a quantized Linear and packed experts run decode's kernels
// for those rows however many share the product, and prefill's for the others, so every sequence of a server's
// step gets the bits it gets alone (ops::linear's decode_rows). The model's forward opens a scope over its decoder
// (one flag per token row, in the order of the layers' [B * T] rows) and another over its lm_head's rows; layers
// read it where their input has that many rows. A scope, as NoGradGuard is one, rather than an argument threaded
// through every projection call of every architecture; what the scope holds changes which kernel runs, never what
// is computed beyond its last bits. Nested scopes hide the outer one; an empty one hides it with nothing (a style
// that brings other ranks' tokens in).
#include <cstdint>
#include <span>
#include <vector>

namespace tp::nn {

class DecodeRows {
 public:
  explicit DecodeRows(std::vector<uint8_t> flags);
  ~DecodeRows();
  DecodeRows(const DecodeRows&) = delete;
  DecodeRows& operator=(const DecodeRows&) = delete;

  // The innermost scope's flags if they cover `rows` rows, else none (the count then picks the kernel).
  static std::span<const uint8_t> for_rows(int64_t rows);

 private:
  std::vector<uint8_t> flags_;
  const DecodeRows* outer_;
};

}  // namespace tp::nn
