#pragma once
// Training only the adapters of a LoraModel with the Trainer: the base is frozen
// (no gradients, no optimizer state), save_model writes the PEFT adapter
// directory, and the dropout masks follow the optimizer step.
//
//   peft::LoraModel lora = peft::apply_lora(model, config, peft::peft_init(args.seed));
//   Trainer trainer(model, args, data, nullptr, peft::adapter_training(model, lora));
//   trainer.add_callback(peft::adapter_step_callback(lora));
#include <memory>

#include "tp/peft/lora.h"
#include "tp/training/trainer.h"

namespace tp::peft {

training::TrainerOptions adapter_training(PretrainedModel& model, LoraModel& lora);
std::shared_ptr<training::TrainerCallback> adapter_step_callback(LoraModel& lora);

}  // namespace tp::peft
