#pragma once
// A linear weight held quantized: W [N, K] as 4- or 8-bit integer codes with one
// scale and one integer zero point per row and group of inputs,
//
//   W[n, k] = scale[n, grp(k)] * (code[n, k] - zero[n, grp(k)])
//   grp(k) = k / group_size, or g_idx[k] (GPTQ's act-order: groups in any order),
//
// the form GPTQ, AWQ and compressed-tensors checkpoints share once unpacked
// (models/quantized_checkpoint.h reads them). Only the codes, the scales and the
// zeros are resident: 4.2 bits a weight for 4-bit codes in groups of 128 (prefill adds
// one buffer a thread, reused: the largest layer dequantized, 2 bytes a weight in bf16).
//
// Decode's products (1-4 rows) run ordered_gemm's fixed sequence (ordered_gemm.h) over W's values, made
// in registers as the codes are read: W's f32 values are fl(scale * (code - zero)) (one rounding: code - zero
// is an exact small integer), so such a product equals ordered_gemm over dequantize() bit for bit. On a CPU
// with AVX512-VNNI they run an integer dot-product kernel instead (quantized_linear.cpp): x quantized per row to
// 16 bits (scale sx = max |x| / 32767), the products exact, within sx / 2 * sum |w| of the exact product. Prefill's (more rows) dequantize W whole into a
// reused buffer and run the GEMM over it (oneDNN; ordered_gemm where inference products run it), in f32 or
// (a bf16 model) in bf16. Within each kind a row's output has the same bits whatever the rows around it
// (prefill's: given decode_rows, below, which runs it over at least 16 rows, where oneDNN's order is one).
// Under act-order the inputs are permuted once at load so that each group's inputs are contiguous (runs),
// and x is permuted the same way per call; the sums then run over K in that order.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "tp/tensor/tensor.h"

namespace tp::ops {

class QuantizedLinear {
 public:
  QuantizedLinear() = default;
  // codes u8 [N, K] (one code a byte, < 2^bits), scales f32 [N, G], zeros u8 [N, G]
  // (< 2^bits), g_idx i32 [K] with values < G or undefined (then group k / group_size,
  // G = ceil(K / group_size)). Errors name what does not fit.
  QuantizedLinear(int bits, int64_t group_size, const Tensor& codes, const Tensor& scales, const Tensor& zeros,
                  const Tensor& g_idx = Tensor());

  bool defined() const { return state_ != nullptr; }
  int bits() const;
  int64_t out_features() const;
  int64_t in_features() const;
  int64_t groups() const;
  // Bytes held: codes, scales, zeros and the input permutation (act-order).
  size_t nbytes() const;
  // What nbytes() will be for an [n, k] weight in `groups` groups whose scales are all f16 values (GPTQ's and
  // AWQ's are f16; a scale that is not one costs 2 bytes more): what a plan reports before any weight is read.
  static size_t resident_bytes(int bits, int64_t n, int64_t k, int64_t groups, bool permuted);
  // MXFP4 (GPT-OSS's experts): codes u8 [N, K] E2M1 (bit 3 the sign, bits 0-2 index {0, 0.5, 1, 1.5, 2, 3, 4,
  // 6}), exponents u8 [N, K / 32] E8M0 (each block of 32 inputs times 2^(e - 127)). Held as 4-bit codes mapped
  // to 2 x E2M1 (exact integers) with the scale 2^(e - 128) (f16 where it is one) and no zero points.
  static QuantizedLinear e2m1(const Tensor& codes, const Tensor& exponents);
  // What e2m1's nbytes() will be for an [n, k] weight (f16 scales).
  static size_t e2m1_resident_bytes(int64_t n, int64_t k) {
    return resident_bytes(4, n, k, k / 32, false) - static_cast<size_t>(n * (k / 32));
  }
  // W as f32 [N, K], in the checkpoint's input order (tests, merges, references).
  Tensor dequantize() const;
  // Up to how many rows of x decode's kernels (decode_rows flagged) compute the product faster than prefill's
  // dequantize-and-GEMM in bf16. Measured on an MoE expert's [768, 2048] and [2048, 768] weights streamed from
  // memory: the integer kernels' lane panels (4- and 8-bit codes and MXFP4's, rows a multiple of 64, AVX512-VNNI)
  // up to 48 rows (int4 to 56, int8 and MXFP4 to 48; e.g. 24 rows of int4 in 247 us against 439); the other forms
  // (the pair kernels' panels, AVX2) up to ~14 (MXFP4 on them).
  int64_t decode_rows_limit() const;

  struct State;

 private:
  // e2m1_codes: each 4-bit code stands for 2 x its E2M1 value (e2m1), the zero points all 0.
  QuantizedLinear(int bits, int64_t group_size, const Tensor& codes, const Tensor& scales, const Tensor& zeros,
                  const Tensor& g_idx, bool e2m1_codes);
  friend void linear_into(Tensor& out, const Tensor& x, const QuantizedLinear& w, const Tensor& b, DType compute,
                          std::span<const uint8_t> decode_rows);
  friend Tensor linear(const Tensor& x, const QuantizedLinear& w, const Tensor& b, DType compute,
                       std::span<const uint8_t> decode_rows);
  std::shared_ptr<const State> state_;
};

namespace detail {
// The kernel of a product of `rows` (1-4) rows of x: TP_QUANTIZED_ISA (avx2, avx512, avx512vnni) or the best
// this CPU has, an exact one (avx2, avx512) where inference products run ordered_gemm (ordered_gemm_wanted:
// TP_GEMM=ordered, or no brgemm f32 matmul).
enum class QuantizedKernel { Avx2, Avx512, Avx512Vnni };
QuantizedKernel quantized_decode_kernel(int64_t rows);
// Rows this process's quantized products have run through decode's kernels and through prefill's (padding
// rows included), so far: how a caller's decode steps can be seen to take decode's kernels.
struct QuantizedRows {
  int64_t decode = 0;
  int64_t prefill = 0;
};
QuantizedRows quantized_rows_so_far();
}  // namespace detail

// y [..., N] = x [..., K] · W^T (+ b [N]); x f32. `compute`: the arithmetic of more rows than decode's
// (prefill), which run the GEMM over W dequantized whole into a reused buffer: F32 over W's f32 values, BF16 (a
// bf16 model) over x and W's values rounded to bf16, as a bf16 Linear computes. W is frozen: where x needs a
// gradient (LoRA over a quantized base) the backward gives x's alone, dx = dy · W over the same dequantized W in
// the same arithmetic; a bias that needs one is an error.
//
// `decode_rows` (one flag per row of x, or empty): which rows are decode steps, each a sequence's newest token.
// Empty, the row count picks the kernel (decode's up to 4 rows, prefill's above), so a row's bits depend on how
// many rows share its product. Given, each row takes its own kind's kernel however many rows there are: decode's
// for flagged rows (up to 16 a sweep over W, whose blocks meet them four rows at a time while in L2, so W is
// read from memory once), prefill's for the others. A server's step then gives each sequence the bits it gets
// alone (a prompt's chunk beside 12 decodes, 12 decodes at once).
Tensor linear(const Tensor& x, const QuantizedLinear& w, const Tensor& b = Tensor(), DType compute = DType::F32,
              std::span<const uint8_t> decode_rows = {});
// The same into a preallocated f32 out [..., N].
void linear_into(Tensor& out, const Tensor& x, const QuantizedLinear& w, const Tensor& b = Tensor(),
                 DType compute = DType::F32, std::span<const uint8_t> decode_rows = {});

}  // namespace tp::ops
