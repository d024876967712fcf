#include "tp/training/lora_training.h"

#include "tp/training/adapter_files.h"

namespace tp::training {

TrainerOptions adapter_training(PretrainedModel& model, LoraModel& lora) {
  TrainerOptions o;
  o.trainable = &LoraModel::is_adapter_parameter;
  o.save_model = [&model, &lora](const std::filesystem::path& dir,
                                 const std::function<Tensor(const nn::Parameter&)>& values) {
    save_adapter(model, lora, dir, values);
  };
  o.on_step_begin = [&lora](int64_t step, int64_t first_row) { lora.begin_step(step, first_row); };
  return o;
}

}  // namespace tp::training
