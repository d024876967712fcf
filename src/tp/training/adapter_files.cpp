#include "tp/training/adapter_files.h"

#include <set>

#include "tp/io/json_file.h"
#include "tp/io/tensor_store.h"
#include "tp/io/writer.h"
#include "tp/models/save_pretrained.h"
#include "tp/parallel/shards.h"

namespace tp::training {

namespace fs = std::filesystem;

void save_adapter(PretrainedModel& model, const LoraModel& lora, const fs::path& dir,
                  const std::function<Tensor(const nn::Parameter&)>& values) {
  dist::ProcessGroup& group = model.mesh().group("tp");
  prepare_output_directory(dir, group);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const AdaptedModule& a : lora.adapted())
    for (const nn::Parameter* f : {a.A, a.B}) {
      const nn::Parameter& p = *f;
      Tensor local = values ? values(p) : p.data;
      Tensor full = parallel::gather_full(local, p.global_shape, parallel::all_shards(p.shard, group), group);
      tensors.emplace_back(LoraModel::peft_key(p.name), full.dtype() == DType::F32 ? full : full.to(DType::F32));
    }
  // Every rank learns whether rank 0's writes worked (no rank waits on a failed one).
  dist::on_rank0(group, "save_adapter", [&] {
    LoraConfig c = lora.config();
    if (c.target_modules.empty() && !c.target_regex) c.target_modules = c.targets_for(model.lm().default_lora_targets(), model.config().model_type);
    if (c.base_model_name_or_path.empty()) c.base_model_name_or_path = model.source_dir().string();
    io::write_json_file(dir / "adapter_config.json", c.to_json());
    io::save_safetensors(dir / "adapter_model.safetensors", tensors, {{"format", "pt"}});
  });
}

LoraModel load_adapter(PretrainedModel& model, const fs::path& dir) {
  TP_CHECK(fs::is_directory(dir), "adapter directory {} does not exist or is not a directory", dir.string());
  const fs::path config_file = dir / "adapter_config.json";
  TP_CHECK(fs::exists(config_file), "{}: no adapter_config.json (a PEFT adapter directory needs one)", dir.string());
  const LoraConfig config = LoraConfig::from_json(io::read_json_file(config_file), config_file.string());
  TP_CHECK(fs::exists(dir / "adapter_model.safetensors"),
           "{}: no adapter_model.safetensors (PEFT's .bin adapters are not read; save with safe_serialization)",
           dir.string());
  const io::TensorStore store = io::TensorStore::open(dir, "adapter_model");
  const std::string file = (dir / "adapter_model.safetensors").string();
  std::set<std::string> unused;
  for (const std::string& name : store.tensor_names()) unused.insert(name);
  LoraModel lora = apply_lora(model, config, [&](const nn::Parameter& p) {
    const std::string key = LoraModel::peft_key(p.name);
    TP_CHECK(store.has(key), "{}: no tensor '{}' (adapter_config.json targets this module; is the adapter for "
             "another model?)", file, key);
    const Shape& shape = store.info(key).shape;
    TP_CHECK(shape == p.global_shape, "{}: '{}' has shape {} but this model needs {} (r = {} and the base module's "
             "sizes; is the adapter for another model?)", file, key, shape_str(shape), shape_str(p.global_shape),
             config.r);
    unused.erase(key);
    return store.read(key, DType::F32);
  });
  TP_CHECK(unused.empty(), "{}: tensor '{}' belongs to no module of this {} model that adapter_config.json targets",
           file, unused.empty() ? "" : *unused.begin(), model.config().model_type);
  return lora;
}

}  // namespace tp::training
