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
  return o;
}

namespace {

class AdapterSteps : public TrainerCallback {
 public:
  explicit AdapterSteps(LoraModel& lora) : lora_(lora) {}
  void on_step_begin(const TrainingArguments&, const TrainerState& state) override {
    lora_.begin_step(state.global_step);
  }

 private:
  LoraModel& lora_;
};

}  // namespace

std::shared_ptr<TrainerCallback> adapter_step_callback(LoraModel& lora) {
  return std::make_shared<AdapterSteps>(lora);
}

}  // namespace tp::training
