#pragma once
// The causal-LM loss: logits at position t predict labels[t + 1] (Transformers
// shifts inside the model), targets equal to ignore_index (-100) count for
// nothing, and the sum of the token losses is divided by `normalizer`: the
// number of targets in the whole optimizer step, so that gradient accumulation
// and micro-batch splits do not change the loss (Transformers' num_items_in_batch).
//
// Vocab-parallel (Megatron's cross-entropy, torch's loss_parallel): when the
// logits are this rank's slice of the vocabulary, they are never gathered. Per
// token: all-reduce MAX of the row max, then one all-reduce SUM of the sum of
// exponentials and of the target logit (non-zero only on the rank that owns the
// target). The backward needs no communication: softmax minus the one-hot, the
// one-hot only where this rank owns the target. With full logits (group null or
// of size 1) the same code runs without collectives.
#include <cstdint>
#include <optional>

#include "tp/distributed/process_group.h"
#include "tp/tensor/tensor.h"

namespace tp::training {

struct VocabSlice {
  int64_t start = 0;                  // first vocabulary id of these logits
  int64_t vocab_size = 0;             // the whole vocabulary (for the label check)
  dist::ProcessGroup* group = nullptr;  // the ranks holding the other slices; null: full logits
};

// The targets `labels` [B, T] contributes: labels[b, t] != ignore_index for t >= 1.
int64_t count_targets(const Tensor& labels, int64_t ignore_index = -100);

// logits [B, T, V_local] f32, labels [B, T] i64/i32 -> scalar: sum of losses / normalizer.
// Differentiable w.r.t. logits. A label outside [0, vocab_size) is an error naming it.
Tensor causal_lm_loss(const Tensor& logits, const Tensor& labels, double normalizer, const VocabSlice& vocab,
                      int64_t ignore_index = -100);

// The same loss from lm_head's input, fused (Liger Kernel's fused linear
// cross-entropy): hidden [B, T, H] f32 times this rank's lm_head rows w [V_local, H]
// (`compute` as nn::Linear::compute_dtype) a chunk of about `chunk_bytes` of
// logits at a time, so no [B * T, V_local] tensor is ever held; the backward
// computes each chunk's logits again and adds its gradients into hidden's and w's.
// The loss equals causal_lm_loss's (the same GEMM per row, the same sums);
// gradients to about 1e-6 (dw sums the chunks' products one chunk after another).
// Every rank of the vocab group runs the same number of chunks. When w takes its
// gradient by rows (autograd::LeafByRows: FSDP's root), the backward makes it a
// block of w's rows at a time, every chunk of tokens for each block, and hands
// each block to the sink whole (hidden's gradient then sums the blocks' products).
Tensor causal_lm_loss_from_hidden(const Tensor& hidden, const Tensor& w, std::optional<DType> compute,
                                  const Tensor& labels, double normalizer, const VocabSlice& vocab,
                                  int64_t ignore_index = -100, int64_t chunk_bytes = int64_t{64} << 20);

}  // namespace tp::training
