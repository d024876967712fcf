#pragma once
// Linear layers and matrix products (oneDNN).
//
//   linear:  y [..., N] = x [..., K] · w [N, K]^T (+ b [N])   (Hugging Face weight layout [out, in])
//   matmul:  y [..., M, N] = a [..., M, K] · b [K, N]
//
// x is f32; w is f32 or bf16 (bf16: x is converted to bf16 in a reused per-thread
// buffer, products accumulate in f32, y is f32).
//
// `compute` = BF16 with an f32 w: bf16 arithmetic on f32 storage, for machines
// where bf16 GEMMs are the slow path (detail::bf16_gemm_native): x (and, in the
// backward, dy) are rounded to bf16 values and the GEMMs run in f32; w must hold
// bf16 values already (a trainer's compute copy does). Default: w's dtype.
#include <cstdint>
#include <memory>
#include <optional>

#include "tp/tensor/tensor.h"

namespace tp::ops {

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = Tensor(), std::optional<DType> compute = {});
Tensor matmul(const Tensor& a, const Tensor& b);

// A weight packed once into oneDNN's preferred blocked layout (format_tag::any +
// reorder) and reused by every call: the inference path. By default it keeps the
// original tensor too, so linear() through it stays differentiable w.r.t. x and w;
// with keep_weight = false the original is released after packing (inference only:
// half the weight memory; gradients and repack() are then errors).
// Copies share the packed state. Call repack() after w's values change.
class PackedLinear;
namespace detail {
// How a bf16 PackedLinear multiplies: oneDNN's bf16 GEMM (Native), or f32 GEMMs
// over pair-swapped panels that give the same bits where the CPU allows
// (Paired, bf16_pairs.h). Auto takes Paired from 64 rows up when f32 GEMMs are the
// faster ones here (bf16_gemm_native) and the probe found the bits equal;
// TP_BF16_GEMM=native keeps Native.
// Auto also runs up to 16 rows (decode) through the kernel of bf16_gemv.h where it
// gives oneDNN's bits. Native keeps oneDNN for every row count.
enum class Bf16Path { Auto, Native, Paired };
enum class Bf16Kernel { OneDnn, Paired, Gemv, Ordered };
// linear_into on the given path; returns the kernel that ran (Paired can't for an
// odd K or a packed layout other than BA16a64b2a, nor for f32 weights).
Bf16Kernel linear_into_path(Tensor& out, const Tensor& x, const PackedLinear& w, const Tensor& b, Bf16Path path);
// Whether Paired gives Native's bits on this machine (probed once per process).
bool bf16_paired_f32_exact();
// Whether the decode kernel prefetches ahead of the hardware's prefetcher: 1 or 0
// once the process has timed both on its first large one-row products, -1 before.
int bf16_decode_prefetch_choice();
}  // namespace detail

class PackedLinear {
 public:
  PackedLinear() = default;
  explicit PackedLinear(const Tensor& w, bool keep_weight = true);  // w [N, K], f32 or bf16
  void repack();
  // The original weight; undefined when it was released (keep_weight = false).
  const Tensor& weight() const { return weight_; }
  int64_t in_features() const { return shape_.size() == 2 ? shape_[1] : 0; }
  int64_t out_features() const { return shape_.size() == 2 ? shape_[0] : 0; }
  DType dtype() const { return dtype_; }
  bool defined() const { return state_ != nullptr; }
  // Packed copies held (1 unless oneDNN asked for another layout for some row count;
  // 1 under ordered_gemm, whose one copy is the weight itself, unpacked).
  size_t packed_copies() const;
  // Whether this bf16 weight's products run, from 64 rows on, as f32 GEMMs of its
  // bf16 values (the paired form, bit for bit the native GEMM's): where f32 GEMMs
  // are the faster ones here (detail::bf16_gemm_native), decided when it is packed.
  bool prefers_f32_gemms() const { return prefers_f32_gemms_; }
  void set_prefers_f32_gemms(bool f32) { prefers_f32_gemms_ = f32; }

  struct State;  // oneDNN primitives and packed weights, per row count

 private:
  friend detail::Bf16Kernel detail::linear_into_path(Tensor& out, const Tensor& x, const PackedLinear& w,
                                                     const Tensor& b, detail::Bf16Path path);
  Tensor weight_;
  Shape shape_;
  DType dtype_ = DType::F32;
  bool prefers_f32_gemms_ = false;
  std::shared_ptr<State> state_;
};

// Several weights [N_i, K] of one dtype packed as their row stack [sum N_i, K]
// (q|k|v, gate|up run as one GEMM). The stack lives only until it is packed:
// from malloc, not the block cache, which would keep one per layer shape
// resident after loading.
PackedLinear pack_stacked(const std::vector<Tensor>& weights);

Tensor linear(const Tensor& x, const PackedLinear& w, const Tensor& b = Tensor());
// No grad, no tensor allocation: writes x · w^T (+ b) into out [..., N] (preallocated f32).
void linear_into(Tensor& out, const Tensor& x, const PackedLinear& w, const Tensor& b = Tensor());

}  // namespace tp::ops
