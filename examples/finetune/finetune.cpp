// Fine-tunes a model for a few steps on a text file and saves it in Hugging
// Face's files, with Transformers' Trainer arguments.
//   tprun --nproc-per-node 2 ./finetune MODEL_DIR train.txt OUT_DIR 10
#include <cstdio>
#include <memory>
#include <string>

#include "tp/training/trainer.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s MODEL_DIR TEXT_FILE OUTPUT_DIR [MAX_STEPS]\n", argv[0]);
    return 2;
  }
  try {
    const std::string dir = argv[1];
    // f32 master weights, nothing packed for inference: what the optimizer
    // updates.
    tp::PretrainedModel model = tp::AutoModelForCausalLM::from_pretrained(dir, tp::LoadOptions::for_training());
    auto data = std::make_shared<tp::training::TokenBlocks>(
        tp::training::TokenBlocks::from_files({argv[2]}, tp::Tokenizer::from_model_dir(dir), {.seq_len = 16}));

    tp::Trainer trainer(model,
                        tp::TrainingArguments{.output_dir = argv[3],
                                              .max_steps = argc > 4 ? std::stoll(argv[4]) : 10,
                                              .per_device_train_batch_size = 4,
                                              .learning_rate = 3e-3,
                                              .logging_steps = 5,
                                              .save_strategy = "no",
                                              .disable_tqdm = true},
                        data);
    tp::training::TrainOutput out = trainer.train();
    trainer.save_model();  // config.json, model.safetensors, the tokenizer files
    if (model.tp_rank() == 0)
      std::printf("%lld steps, mean loss %.4f, saved to %s\n", static_cast<long long>(out.global_step),
                  out.training_loss, argv[3]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
