#pragma once
// Dropout masks drawn by position, not by call order: element (i, j) of a
// [rows, cols] window whose first row is row `first_row` and first column is
// column `first_col` of a [.., full_cols] matrix keeps 1 / (1 - p) when
// uniform01(stream, (first_row + i) * full_cols + first_col + j) >= p, else 0.
// Every rank and every recompute that draws the same window draws the same mask.
#include <cstdint>

#include "tp/tensor/tensor.h"

namespace tp::ops {

struct DropoutWindow {
  int64_t first_row = 0, first_col = 0, full_cols = 0;
};

// f32 mask of `shape` (its last dim the window's columns, the others its rows).
Tensor dropout_mask(const Shape& shape, double p, uint64_t stream, const DropoutWindow& window);

}  // namespace tp::ops
