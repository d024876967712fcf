// tp plan: what a tp_size would do to a model, from config.json alone — no ranks
// started, no weights read (when the directory has weights, their headers are
// checked against the config first). For every parameter: style, global shape, the shape
// and bytes on each rank; the collectives per forward; the warnings.
#include <nlohmann/json.hpp>

#include <iostream>
#include <memory>

#include "tp/cli/command.h"
#include "tp/cli/common.h"
#include "tp/models/checkpoint.h"
#include "tp/models/plan_report.h"

namespace tp::cli {
namespace {

struct PlanFlags {
  ModelFlags model;
};

int run_plan(const PlanFlags& f) {
  if (!f.model.tp_size) throw UsageError("--tp-size is required (the number of ranks to plan for)");
  const std::filesystem::path dir = f.model.model;
  const ModelConfig config = Checkpoint::read_config(dir);
  DType dtype = parse_dtype_flag(f.model.dtype).value_or(config.torch_dtype == "bfloat16" ? DType::BF16 : DType::F32);
  PlanReport report = make_plan_report(config, load_options(f.model).distributed_config, dtype);
  if (f.model.json) {
    std::cout << plan_report_json(report).dump(2) << "\n";
  } else {
    print_plan_report(std::cout, report);
  }
  for (const std::string& w : report.warnings) std::cerr << "warning: " << w << "\n";
  return 0;
}

Registrar reg("plan", "Show how a tp_size splits a model (per-rank shapes, bytes, collectives) without loading it",
              [](CLI::App& app) {
                auto f = std::make_shared<PlanFlags>();
                add_model_flags(app, f->model);
                add_sequence_parallel_flag(app, f->model);
                return [f] { return run_plan(*f); };
              });

}  // namespace
}  // namespace tp::cli
