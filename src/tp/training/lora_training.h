#pragma once
// Training only the adapters of a LoraModel with the Trainer: the base is frozen
// (no gradients, no optimizer state), save_model writes the PEFT adapter
// directory, and the dropout masks follow the optimizer step.
//
//   training::LoraModel lora = training::apply_lora(model, config, training::peft_init(args.seed));
//   Trainer trainer(model, args, data, nullptr, training::adapter_training(model, lora));
#include "tp/training/lora.h"
#include "tp/training/trainer.h"

namespace tp::training {

TrainerOptions adapter_training(PretrainedModel& model, LoraModel& lora);

}  // namespace tp::training
