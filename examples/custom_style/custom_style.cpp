// The seed's walk-through: register a configured style instance under a new
// name, name it in a tp_plan, load the model with that plan and run it.
//   tprun --nproc-per-node 2 ./custom_style MODEL_DIR
#include <cstdio>
#include <iostream>
#include <memory>

#include "tp/models/auto.h"
#include "tp/parallel/colwise.h"
#include "tp/parallel/registry.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL_DIR\n", argv[0]);
    return 2;
  }
  try {
    // Registration takes an instance: the options given here live with the
    // name.
    tp::parallel::register_style("colwise_custom", std::make_shared<tp::parallel::ColwiseParallel>());

    tp::DistributedConfig dc;
    dc.tp_plan = R"({"model.layers.*.self_attn.q_proj": "colwise_custom",
                     "model.layers.*.self_attn.k_proj": "colwise_custom",
                     "model.layers.*.self_attn.v_proj": "colwise_custom"})";
    tp::PretrainedModel model = tp::AutoModelForCausalLM::from_pretrained(argv[1], {.distributed_config = dc});

    tp::Tensor ids = tp::Tensor::from_ints({1, 2, 3, 4}, {1, 4});
    tp::Tensor logits = model.forward(ids);  // [1, 4, vocab] on every rank
    const float* last = logits.data<float>() + 3 * model.config().vocab_size;
    int64_t best = 0;
    for (int64_t v = 1; v < model.config().vocab_size; ++v)
      if (last[v] > last[best]) best = v;
    if (model.tp_rank() == 0) {
      std::cout << "q_proj.weight: " << model.resolved_plan().param_style.at("model.layers.0.self_attn.q_proj.weight")
                << "\n";
      std::cout << "next token after 1,2,3,4 at tp_size " << model.tp_size() << ": " << best << "\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
