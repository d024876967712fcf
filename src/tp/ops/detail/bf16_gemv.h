#pragma once
// Decode's one-row bf16 product, read straight from the packed weight, with the
// bits of oneDNN's bf16 GEMM.
//
// At one row the product only streams the weight: oneDNN's kernel read it at 80-86%
// of the bandwidth a plain read pass got here, this one at 86-100% (Xeon, AVX512-BF16,
// 1.26 GB of weights a pass; on an AMD EPYC, without its prefetch, at the read pass's
// rate where oneDNN got 55%). It runs the same VDPBF16PS steps in the same order, so
// the results are the same bits: oneDNN sums K in chunks (a pair-order chain from zero
// over each chunk, the chunks' sums then added in order; 512 or 1024 rows on
// this build), and ops::PackedLinear finds the chunk per weight shape by comparing
// with oneDNN's own result on a probe row, or keeps oneDNN where none matches.
#include <cstdint>
#include <dnnl.hpp>

#include "tp/tensor/dtype.h"

namespace tp::ops::detail {

// Whether this CPU runs the kernel (AVX512-BF16).
bool bf16_gemv_available();

// Rows the kernel takes (a serving step's decode rows). Each row's sums are the
// one-row kernel's steps in the same order, so a row's bits do not depend on the
// rows beside it; the weight is streamed once for all of them.
constexpr int64_t kBf16GemvMaxRows = 16;

// y [m, n] = x [m, k] · w (+ bias [n]) for a packed bf16 weight [k, n] whose layout
// is_bf16_panel_layout accepts, x as bf16 values, k even, 1 <= m <= kBf16GemvMaxRows;
// the sum runs over K in chunks of `chunk` rows (see above). Panels are split over
// OpenMP threads.
void bf16_panel_gemv(const bf16* x, int64_t m, const bf16* packed, const dnnl::memory::desc& md, int64_t chunk,
                     const float* bias, float* y);

// Whether the kernel prefetches ahead of the hardware: 1 or 0 once decided (timed on
// the process's first large one-row products, or TP_BF16_GEMV_PREFETCH), -1 before.
int bf16_gemv_prefetch_choice();

}  // namespace tp::ops::detail
