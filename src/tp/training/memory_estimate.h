#pragma once
// What a training step will hold per rank, from config.json and the run's
// arguments alone (before any weight is read): `tp train --estimate-memory`, the
// line at the start of every run, and the check that stops a run which cannot fit.
//
// The terms are the tensors the Trainer and the autograd tape keep (see
// ../shared/reference/memory.md for the textbook forms):
//   weights      f32 masters (4 bytes per local parameter; under dp_shard and bf16
//                only this rank's chunks of the matrices) and, under bf16, the compute
//                copy of the matrices (2 bytes, or 4 where bf16 is run as f32 GEMMs):
//                held a unit at a time (compute_copy_by_layer, without dp_shard),
//                the root's (embeddings, lm_head) or a decoder layer's, the larger;
//   gradients    the f32 gradient slab (4 bytes per local parameter);
//   (under fsdp, masters and gradients / dp_shard, plus the gathered compute
//   weights and whole gradient of the root unit or a layer, the larger);
//   optimizer    AdamW's two moments (8 bytes; / dp_shard), SGD's momentum (4 or 0);
//   activations  what each decoder layer saves for its backward (per layer: the
//                residual stream at the norms, bf16 copies of the projections'
//                inputs, q/k/v for attention, gate and up for SwiGLU; under
//                sequence parallelism the sequence-sharded ones / tp), or with
//                checkpointing its input (full) or its GEMMs', attention's and
//                all-reduces' outputs (selective), plus one layer's recompute;
//   loss         the fused loss's saved input and its chunk of logits (or the whole
//                [tokens, vocab / tp] logits and their gradient when not fused);
//   workspace    the backward's temporaries of one layer.
// Dense decoders (Llama, Mistral, Qwen3): the measured allocator high-water mark
// of a step is within 15% of the total (tests/training/test_memory_estimate).
#include <algorithm>
#include <cstdint>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>

#include "tp/models/config.h"
#include "tp/models/gradient_checkpointing.h"
#include "tp/parallel/plan.h"

namespace tp::training {

struct MemoryEstimateInputs {
  ModelConfig config;
  parallel::DistributedConfig distributed;  // tp_size, plan, sequence parallelism
  int64_t dp_shard_size = 1;
  bool fsdp = false;  // fully sharded over dp_shard (TrainingArguments.fsdp)
  bool fsdp_reshard_after_forward = true;  // else every layer stays gathered from its forward to its backward
  int64_t seq_len = 1024;
  int64_t batch_size = 1;  // per device
  bool bf16 = false;
  bool bf16_native = true;  // bf16 GEMMs (else bf16 values run as f32 GEMMs: a 4-byte compute copy)
  // TrainerOptions::compute_copy_by_layer (used under bf16 without dp_shard): else a whole compute copy.
  bool compute_copy_by_layer = true;
  std::string optim = "adamw_torch";
  double sgd_momentum = 0;
  GradientCheckpointing checkpointing;
  bool fused_loss = true;
};

struct MemoryEstimate {
  int64_t weights = 0, gradients = 0, optimizer = 0;
  int64_t activations_per_layer = 0;  // saved by a layer (a checkpointed one: what it keeps)
  int64_t activations = 0;            // every layer's, at the start of the backward
  int64_t loss = 0;                   // the final norm's input and what the loss saved
  // The backward's peak on top of them: the loss's backward, or a layer's
  // recompute (checkpointing) and its temporaries, whichever is larger.
  int64_t loss_backward = 0, recompute = 0, workspace = 0;
  int64_t backward_peak() const { return std::max(loss_backward, recompute + workspace); }
  int64_t total = 0;  // the peak per rank: the sum of the terms above
  int64_t layers = 0;
  nlohmann::ordered_json to_json() const;
};

// Errors name what cannot be estimated (a MoE or MLA model: not yet).
MemoryEstimate estimate_training_memory(const MemoryEstimateInputs& in);
void print_memory_estimate(std::ostream& out, const MemoryEstimate& e);
// Stops a run whose `ranks_here` ranks (those on this machine) would not fit in
// its available memory (MemAvailable), with a message naming the flags that would
// make it fit and what each would predict. TP_SKIP_MEMORY_CHECK=1 runs anyway.
void check_memory_fits(const MemoryEstimateInputs& in, const MemoryEstimate& e, int64_t ranks_here);
// What a rank's resident set holds beyond the predicted tensors: the allocator's
// cached blocks, the libraries and the load's peak (see memory_estimate.cpp for the figures).
int64_t resident_bytes(const MemoryEstimate& e);
// "x.xx GiB"
std::string gib(int64_t bytes);

}  // namespace tp::training
