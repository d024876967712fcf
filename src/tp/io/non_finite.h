#pragma once
// NaN and Inf in a tensor as stored (f32, bf16 or f16), found from the exponent
// bits, so no value is converted: `tp inspect --verify` runs it over every
// tensor of a checkpoint as the pages are read.
#include <cstddef>

#include "tp/tensor/tensor.h"

namespace tp::io {

struct NonFinite {
  size_t count = 0;  // how many elements are NaN or Inf
  size_t first = 0;  // the flat index of the first (numel when there is none)
};

// Integer dtypes hold no NaN: {0, 0} for them.
NonFinite find_non_finite(const Tensor& t);

}  // namespace tp::io
