// tp merge-adapter: a Hugging Face checkpoint with a PEFT LoRA adapter merged in
// (W + scaling * B A for every adapted module), in the base's names, dtypes and
// files. Runs at any tp size: each rank merges its slices, and save_pretrained
// gathers them.
#include <memory>

#include "tp/cli/command.h"
#include "tp/cli/common.h"
#include "tp/distributed/process_group.h"
#include "tp/models/save_pretrained.h"
#include "tp/training/adapter_files.h"

namespace tp::cli {
namespace {

struct MergeFlags {
  ModelFlags model;
  std::string adapter;
  std::string out;
};

int run_merge(const MergeFlags& f) {
  // Plain f32 weights to add the update to; the files keep the base's dtypes.
  LoadOptions o = LoadOptions::for_training();
  o.distributed_config.tp_plan = f.model.tp_plan;
  o.distributed_config.tp_size = f.model.tp_size;
  PretrainedModel model = AutoModelForCausalLM::from_pretrained(f.model.model, o);
  training::LoraModel lora = training::load_adapter(model, f.adapter);
  lora.merge_into_base();
  save_pretrained(model, f.out);
  if (dist::world().rank() == 0) {
    if (f.model.json)
      fmt::print("{{\"out\": \"{}\", \"merged_modules\": {}}}\n", f.out, lora.adapted().size());
    else
      fmt::print(stderr, "merged {} (r={}, {} modules) into {}: saved to {}\n", f.adapter, lora.config().r,
                 lora.adapted().size(), f.model.model, f.out);
  }
  return 0;
}

Registrar reg("merge-adapter", "Merge a PEFT LoRA adapter into its base model and save the result",
              [](CLI::App& app) {
                auto f = std::make_shared<MergeFlags>();
                add_model_flags(app, f->model);
                app.remove_option(app.get_option("--dtype"));
                app.add_option("--adapter", f->adapter, "PEFT LoRA adapter directory")->required();
                app.add_option("--out", f->out, "output model directory")->required();
                return [f] { return run_merge(*f); };
              });

}  // namespace
}  // namespace tp::cli
