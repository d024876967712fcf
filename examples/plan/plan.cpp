// Prints the plan a model would run with on N ranks, and which style each
// parameter gets, from config.json alone: no weights are read, no ranks needed.
//   ./plan MODEL_DIR 4 ['{"model.layers.*.mlp.down_proj": "rowwise"}']
#include <cstdio>
#include <iostream>
#include <string>

#include "tp/models/auto.h"
#include "tp/version.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL_DIR TP_SIZE [TP_PLAN_JSON]\n", argv[0]);
    return 2;
  }
  try {
    const tp::ModelConfig config = tp::ModelConfig::load(std::string(argv[1]) + "/config.json");
    tp::DistributedConfig dc{.tp_size = std::stoll(argv[2])};
    if (argc > 3) dc.tp_plan = argv[3];  // merged over the model's own plan: the user's entries win

    auto model = tp::AutoModelForCausalLM::from_config(config);  // the module tree, without weights
    tp::parallel::StyleOverrides overrides;
    tp::parallel::ResolvedPlan plan = tp::resolve_model_plan(*model, dc, *dc.tp_size, &overrides);

    std::cout << "tp " << TP_VERSION << ", " << config.model_type << " at tp_size " << *dc.tp_size << "\n";
    std::cout << "plan: " << plan.plan << "\n";
    for (const auto& [param, style] : plan.param_style) std::cout << "  " << param << ": " << style << "\n";
    for (const std::string& warning : plan.warnings) std::cout << "warning: " << warning << "\n";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
