// Generates text on every rank of the job; rank 0 prints it.
//   tprun --nproc-per-node 2 ./generate MODEL_DIR "Can I help" 16
#include "tp/generation/generate.h"

#include <cstdio>
#include <string>

#include "tp/tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL_DIR PROMPT [MAX_NEW_TOKENS]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const int max_new_tokens = argc > 3 ? std::stoi(argv[3]) : 16;
  try {
    tp::Tokenizer tokenizer = tp::Tokenizer::from_model_dir(dir);
    // tp_size unset: every rank of the job is tensor-parallel, with the model's
    // own plan.
    tp::PretrainedModel model = tp::AutoModelForCausalLM::from_pretrained(dir, {.distributed_config = {}});

    tp::generation::GenerateOptions options;
    options.max_new_tokens = max_new_tokens;
    options.eos_token_ids = tp::generation::default_eos_token_ids(model, &tokenizer);
    auto result = tp::generation::generate(model, {tokenizer.encode(argv[2])}, options);
    if (model.tp_rank() == 0)
      std::printf("tp_size %lld: %s%s\n", static_cast<long long>(model.tp_size()), argv[2],
                  tokenizer.decode(result.tokens[0], /*skip_special_tokens=*/true).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
