// tp forward: logits of one sequence, written by rank 0 as f32 `logits` [seq, vocab].
#include <memory>

#include "tp/cli/command.h"
#include "tp/cli/common.h"
#include "tp/distributed/process_group.h"
#include "tp/io/writer.h"

namespace tp::cli {
namespace {

struct ForwardFlags {
  ModelFlags model;
  std::string input_ids;
  std::string out;
  std::string adapter;
};

int run_forward(const ForwardFlags& f) {
  std::vector<int64_t> ids = parse_id_list(f.input_ids, "--input-ids");
  PretrainedModel model = load_model(f.model, f.adapter);
  int64_t V = model.config().vocab_size;
  for (int64_t id : ids)
    if (id >= V) throw UsageError(fmt::format("--input-ids: token id {} is outside the vocabulary [0, {})", id, V));
  Tensor logits = model.forward(Tensor::from_ints(ids, {1, static_cast<int64_t>(ids.size())}));
  // One rank writes: under expert parallelism several ranks are tp rank 0.
  if (dist::world().rank() == 0) {
    io::save_safetensors(f.out, {{"logits", logits.reshape({static_cast<int64_t>(ids.size()), V})}});
    if (f.model.json) fmt::print("{{\"out\": \"{}\", \"shape\": [{}, {}]}}\n", f.out, ids.size(), V);
  }
  return 0;
}

Registrar reg("forward", "Run one forward pass and write the logits to a safetensors file", [](CLI::App& app) {
  auto f = std::make_shared<ForwardFlags>();
  add_model_flags(app, f->model);
  add_sequence_parallel_flag(app, f->model);
  add_adapter_flag(app, f->adapter);
  app.add_option("--input-ids", f->input_ids, "comma-separated token ids, e.g. 1,2,3")->required();
  app.add_option("--out", f->out, "output .safetensors file (f32 tensor `logits` [seq, vocab])")->required();
  return [f] { return run_forward(*f); };
});

}  // namespace
}  // namespace tp::cli
