#pragma once
// Training only the adapters of a LoraModel with the Trainer: the base is frozen
// (no gradients, no optimizer state), save_model writes the PEFT adapter
// directory, and the dropout masks follow the optimizer step.
//
//   training::LoraModel lora = training::apply_lora(model, config, training::peft_init(args.seed));
//   Trainer trainer(model, args, data, nullptr, training::adapter_training(model, lora));
//   trainer.add_callback(training::adapter_step_callback(lora));
#include <memory>

#include "tp/training/lora.h"
#include "tp/training/trainer.h"

namespace tp::training {

TrainerOptions adapter_training(PretrainedModel& model, LoraModel& lora);
std::shared_ptr<TrainerCallback> adapter_step_callback(LoraModel& lora);

}  // namespace tp::training
