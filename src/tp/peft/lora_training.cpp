#include "tp/peft/lora_training.h"

#include "tp/peft/adapter_files.h"

namespace tp::peft {

training::TrainerOptions adapter_training(PretrainedModel& model, LoraModel& lora) {
  training::TrainerOptions o;
  o.trainable = &LoraModel::is_adapter_parameter;
  o.save_model = [&model, &lora](const std::filesystem::path& dir,
                                 const std::function<Tensor(const nn::Parameter&)>& values) {
    save_adapter(model, lora, dir, values);
  };
  return o;
}

namespace {

class AdapterSteps : public training::TrainerCallback {
 public:
  explicit AdapterSteps(LoraModel& lora) : lora_(lora) {}
  void on_step_begin(const training::TrainingArguments&, const training::TrainerState& state) override {
    lora_.begin_step(state.global_step);
  }

 private:
  LoraModel& lora_;
};

}  // namespace

std::shared_ptr<training::TrainerCallback> adapter_step_callback(LoraModel& lora) {
  return std::make_shared<AdapterSteps>(lora);
}

}  // namespace tp::peft
