#pragma once
// Native bf16 GEMMs re-run as f32 GEMMs that give the same bits ("paired f32").
//
// oneDNN's bf16 GEMM on AVX512-BF16 accumulates with VDPBF16PS: each f32 lane adds
// the product of an odd-k pair element and then the even one, rounding after each
// add like an FMA. A product of two bf16 values is exact in f32, so an f32 GEMM
// that sums the same products in the same order gives the same bits: swap every
// pair (k <-> k ^ 1) in both operands and let the f32 kernel run k in order. On a
// Xeon without AMX, oneDNN's f32 GEMM runs about 1.7x as fast as its bf16 one, so
// prefill gets faster with tokens unchanged. Whether the two agree is a property of
// the CPU and oneDNN build; ops::PackedLinear checks it once per process
// (paired_f32_exact in linear.cpp) and otherwise keeps the native GEMM.
//
// The weight side is cut, a few panels at a time, from the packed bf16 weight that
// decode reads anyway (oneDNN's BA16a64b2a layout), so it costs no memory: each
// 64-column panel becomes an f32 [k16][64] block (BA16a64b, f32's own layout).
#include <cstdint>
#include <dnnl.hpp>

#include "tp/tensor/dtype.h"

namespace tp::ops::detail {

// Columns in a packed panel.
constexpr int64_t kPanelColumns = 64;

// K padded to the f32 layout's row block (16).
inline int64_t paired_k_rows(int64_t k) { return (k + 15) / 16 * 16; }

// True when `md` (a bf16 [K, N] weight) is [N/64][K/32][16][64][2] with panels
// stored one after another: the layout pair_swapped_panels reads.
bool is_bf16_panel_layout(const dnnl::memory::desc& md);

// out [m, k] = x's bf16 values (x f32, rounded to nearest even; or x bf16), each
// pair of columns swapped, denormals flushed to zero like VDPBF16PS's inputs. k even.
void pair_swapped_rows(const void* x, DType x_dtype, int64_t m, int64_t k, float* out);

// Panels [first, first + count) of a packed bf16 weight (md as above, dims {k, n})
// into out [count][paired_k_rows(k)][64] f32: row r of a panel holds packed row
// r ^ 1, rows from k on are zero, denormals are flushed to zero.
void pair_swapped_panels(const bf16* packed, const dnnl::memory::desc& md, int64_t first, int64_t count, float* out);

// A per-thread f32 buffer of at least n elements for slot 0, 1 or 2 (the swapped
// rows, the panels, the columns of a chunk); grows, never shrinks.
float* paired_scratch(int slot, size_t n);

}  // namespace tp::ops::detail
