#pragma once
// The optimizer TrainingArguments name (`optim`, `optim_args`, Adam's betas and
// epsilon, weight decay) over a model's trainable parameters.
#include <memory>

#include "tp/training/arguments.h"
#include "tp/training/optimizer.h"
#include "tp/training/parameters.h"

namespace tp::training {

// AdamW (adamw_torch, adamw_torch_fused) or SGD; optim_args "key=value,..." as
// Transformers parses them (sgd: momentum). An unknown key is an error naming it.
std::unique_ptr<Optimizer> make_optimizer(const TrainingArguments& args, ModelParameters& params);

}  // namespace tp::training
