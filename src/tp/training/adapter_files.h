#pragma once
// PEFT adapter directories: adapter_config.json and adapter_model.safetensors
// with PEFT's key names (base_model.model.<module>.lora_A.weight). Saved whole
// (every rank's slices gathered, rank 0 writes), so any tp size, and PEFT
// itself, loads them; loaded by each rank keeping its slice.
#include <filesystem>
#include <functional>

#include "tp/training/lora.h"

namespace tp::training {

// Collective. `values`: the local tensor to save for an adapter parameter
// (default: the model's own), e.g. a Trainer's f32 master weights.
void save_adapter(PretrainedModel& model, const LoraModel& lora, const std::filesystem::path& dir,
                  const std::function<Tensor(const nn::Parameter&)>& values = {});

// Reads `dir` and attaches its adapter. Errors name the file and the key of a
// tensor the model has no place for, a missing one, or a shape that does not
// fit the base module. Collective.
LoraModel load_adapter(PretrainedModel& model, const std::filesystem::path& dir);

}  // namespace tp::training
