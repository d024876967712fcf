#pragma once
// The local phases of the vocab-parallel causal-LM loss (training/loss.h). Each
// rank holds logits for its slice of the vocabulary, from id `start`; the
// reductions over the vocab group run between the phases, in training/loss.cpp,
// since ops/ sits below distributed/:
//
//   loss_row_max            -> all_reduce(Max) of the row maxima
//   loss_exp_sums           -> all_reduce(Sum) of [sum of exponentials | target logit]
//   loss_total              (every rank, on the reduced statistics)
//   loss_softmax_grad_      the backward, local: softmax minus the one-hot where owned
//
// The fused form from lm_head's input (training::causal_lm_loss_from_hidden)
// multiplies a chunk of rows at a time (lm_head_chunk_logits) and, in the
// backward, runs a chunk's whole gradient in one op (lm_head_chunk_backward).
// When lm_head's weight comes a block of rows at a time, loss_online_stats folds
// each block into running statistics and loss_rescale_to_max brings them to the
// group's maximum.
//
// Logits are f32 [n, v]; targets i64 [n], global vocabulary ids or ignore_index;
// statistics are f32 [n] (row max, sum of e^(x - max), target logit).
#include <cstdint>

#include "tp/tensor/tensor.h"

namespace tp::ops {

// row_max[r] = max_j logits[r, j].
void loss_row_max(const Tensor& logits, const Tensor& row_max);
// sums [2, n], zeroed by the caller: sums[0, r] = sum_j e^(logits[r, j] - row_max[r]);
// sums[1, r] = logits[r, target[r] - start] where this slice holds the target.
void loss_exp_sums(const Tensor& logits, const Tensor& row_max, const Tensor& target, int64_t start,
                   int64_t ignore_index, const Tensor& sums);
// One more block of a row's logits (vocabulary ids from `start`) into the running
// max / sum of exponentials / target logit of each row (the online softmax: the
// sum is rescaled when the block raises the max).
void loss_online_stats(const Tensor& logits, const Tensor& target, int64_t start, int64_t ignore_index,
                       const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit);
// sum_exp rescaled from row_max to global_max, then row_max = global_max.
void loss_rescale_to_max(const Tensor& global_max, const Tensor& row_max, const Tensor& sum_exp);
// The sum over targets != ignore_index of log(sum_exp) + row_max - target_logit, in double.
double loss_total(const Tensor& target, int64_t ignore_index, const Tensor& row_max, const Tensor& sum_exp,
                  const Tensor& target_logit);
// logits[r, j] = k * (softmax[r, j] - [j == target[r] - start]) in place; rows with
// an ignored target become 0.
void loss_softmax_grad_(const Tensor& logits, const Tensor& target, int64_t start, int64_t ignore_index,
                        const Tensor& row_max, const Tensor& sum_exp, float k);

// How lm_head multiplies (ops::linear's arithmetic): in f32, with a bf16 weight
// (bf16 operands), or an f32 weight holding bf16 values with the input rounded
// to bf16 values (bf16 arithmetic run as f32 GEMMs).
struct LmHeadMath {
  DType w_dtype = DType::F32;
  bool bf16_values = false;
  bool bf16() const { return w_dtype == DType::BF16 || bf16_values; }
};

// lm_head's input as the fused loss keeps it: the rounded bf16 copy when the
// product is bf16 (what the backward reads: half the bytes), else hidden itself.
Tensor lm_head_saved_input(const Tensor& hidden, const LmHeadMath& math);

// The buffers a chunk reuses: logits of at least [chunk, v] f32, widened [chunk, H]
// f32 for bf16 values on an f32 weight, d_bf16 [chunk, v] bf16 for a bf16 weight's
// backward.
struct LmHeadScratch {
  Tensor logits, widened, d_bf16;
};
LmHeadScratch lm_head_scratch(const LmHeadMath& math, int64_t chunk, int64_t v, int64_t h, bool backward);

// The logits [n, nb] of n saved rows [n, H] by nb rows of lm_head's weight w_rows
// [nb, H], as linear computes them; a view of scratch.logits.
Tensor lm_head_chunk_logits(const Tensor& saved_rows, const Tensor& w_rows, const LmHeadMath& math,
                            const LmHeadScratch& scratch);

// One chunk's backward: its logits again, loss_softmax_grad_ of them (scale k),
// rounded as linear's backward rounds dy, then dh_rows [n, H] = dy · w_rows (+= when
// accumulate_dh; skipped when undefined) and dw [nb, H] += dyᵀ · input (skipped
// when undefined).
void lm_head_chunk_backward(const Tensor& saved_rows, const Tensor& w_rows, const LmHeadMath& math,
                            const Tensor& target, int64_t start, int64_t ignore_index, const Tensor& row_max,
                            const Tensor& sum_exp, float k, const LmHeadScratch& scratch, const Tensor& dh_rows,
                            bool accumulate_dh, const Tensor& dw);

}  // namespace tp::ops
