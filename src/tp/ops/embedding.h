#pragma once
// Embedding lookup for a possibly vocab-sharded table (tensor parallel):
// ids [...] i32/i64, w [V, H] f32/bf16 → [..., H] f32. Row r of w holds token
// vocab_start + r; ids outside [vocab_start, vocab_start + V) give zero rows (another
// rank owns them). Backward scatter-adds into dW; outside ids contribute nothing.
#include "tp/tensor/tensor.h"

namespace tp::ops {

Tensor embedding(const Tensor& ids, const Tensor& w, int64_t vocab_start = 0);

}  // namespace tp::ops
