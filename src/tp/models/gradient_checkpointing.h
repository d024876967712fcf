#pragma once
// Which decoder layers run under activation checkpointing, and how
// (TrainingArguments.gradient_checkpointing and its kwargs; torchtitan's counting:
// with every_n_layers = n, layer i is checkpointed when i + 1 is a multiple of n).
#include <cstdint>

#include "tp/autograd/checkpoint.h"
#include "tp/autograd/tape.h"

namespace tp {

struct GradientCheckpointing {
  bool enabled = false;
  autograd::CheckpointPolicy policy = autograd::CheckpointPolicy::Full;
  int64_t every_n_layers = 1;

  // Only where gradients are recorded: inference and evaluation run as usual.
  bool applies(int64_t layer) const {
    return enabled && autograd::is_grad_enabled() && (layer + 1) % every_n_layers == 0;
  }
};

}  // namespace tp
