#pragma once
// Activation checkpointing (torch.utils.checkpoint, torchtitan's policies).
//
// checkpoint(block, inputs, params, policy) returns block(inputs) but keeps for
// the backward only the inputs (Full), or the inputs and the outputs of the ops
// that keep theirs (Selective: GEMMs, attention, collectives; norms, activations
// and rope are recomputed). In the backward it runs the block again with
// gradients on, each kept op returning its remembered output instead of
// computing it, and backpropagates through that recomputed graph.
//
// The block runs the same kernels, in the same order, in the forward and in its
// recompute (its first forward records a tape like any training forward, which is
// dropped once its outputs are taken), so gradients are bitwise those of the
// block without checkpointing. The block must be deterministic and must not
// depend on anything but its inputs and its parameters (every rank runs the same
// collectives in the recompute, in the same order).
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "tp/tensor/tensor.h"

namespace tp::autograd {

enum class CheckpointPolicy { Full, Selective };

using Block = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;

// `params`: the leaves the block reads (its parameters). Their gradients are
// delivered by the recompute's backward; they are listed so that a
// LeafGradReadyHook reports them when the checkpoint's backward is done.
// Outputs after the first whose gradient is all zero are left out of the
// recompute's backward (a router's logits when no aux loss reads them).
std::vector<Tensor> checkpoint(const Block& block, const std::vector<Tensor>& inputs,
                               const std::vector<Tensor>& params, CheckpointPolicy policy);

// For ops whose output a selective checkpoint keeps (call both, in this order):
//   Tensor y = autograd::kept_output();   // in a recompute: the forward's result
//   if (!y.defined()) { ...compute y...; }
//   autograd::keep_output(y);              // in a selective forward: remember y
// Outside a selective checkpoint both do nothing. An op whose output supersedes
// its input's (an all-reduce of a row-parallel GEMM's partial sums) drops the
// input from what is kept: the recompute then runs that GEMM again.
Tensor kept_output();
void keep_output(const Tensor& y);
void drop_kept_output(const Tensor& x);

// The same for a value a block draws (which dropout mask), under either policy:
//   uint64_t draw = autograd::replayed_value().value_or(next_draw++);  // don't advance in a recompute
//   autograd::keep_value(draw);
std::optional<uint64_t> replayed_value();
void keep_value(uint64_t value);

}  // namespace tp::autograd
