#include "tp/models/checkpoint.h"

#include "tp/io/json_file.h"
#include "tp/models/presets.h"

namespace tp {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool is_known_layout(const std::string& model_type) {
  return model_type == "llama" || model_type == "mistral" || model_type == "qwen3";
}

}  // namespace

Checkpoint Checkpoint::open(const fs::path& dir) {
  TP_CHECK(fs::is_directory(dir), "model directory {} does not exist or is not a directory", dir.string());
  TP_CHECK(fs::exists(dir / "config.json"), "{}: no config.json (a Hugging Face model directory needs one)",
           dir.string());
  Checkpoint c;
  c.config_ = ModelConfig::load(dir / "config.json");
  c.weights_ = io::TensorStore::open(dir);
  validate_against_config(c);
  return c;
}

void validate_against_config(const Checkpoint& ckpt) {
  const ModelConfig& c = ckpt.config();
  if (!is_known_layout(c.model_type)) return;
  const std::string cfg = (ckpt.dir() / "config.json").string();
  for (const ParamSpec& p : checkpoint_layout(c)) {
    TP_CHECK(ckpt.has(p.name), "{}: tensor '{}' {} required by {} (model_type {}, {} layers) is missing",
             ckpt.dir().string(), p.name, shape_str(p.shape), cfg, c.model_type, c.num_hidden_layers);
    const io::TensorInfo& t = ckpt.info(p.name);
    TP_CHECK(t.shape == p.shape, "{}: tensor '{}' has shape {} but {} implies {}", t.file.string(), p.name,
             shape_str(t.shape), cfg, shape_str(p.shape));
    TP_CHECK(is_floating(t.dtype), "{}: tensor '{}' has dtype {}; weights must be F32, BF16 or F16", t.file.string(),
             p.name, io::safetensors_dtype_name(t.dtype));
  }
}

void save_checkpoint(const fs::path& dir, const ModelConfig& config, const std::vector<io::TensorSource>& tensors,
                     size_t max_shard_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  TP_CHECK(!ec, "cannot create directory {}: {}", dir.string(), ec.message());
  io::write_json_file(dir / "config.json", config.to_json());
  io::write_weight_files(dir, tensors, max_shard_bytes);
}

void save_checkpoint(const fs::path& dir, const ModelConfig& config,
                     const std::vector<std::pair<std::string, Tensor>>& tensors, size_t max_shard_bytes) {
  std::vector<io::TensorSource> sources;
  for (auto& [name, t] : tensors) sources.push_back(io::TensorSource::of(name, t));
  save_checkpoint(dir, config, sources, max_shard_bytes);
}

void save_generation_config(const fs::path& dir, const ModelConfig& config) {
  json g = {{"_from_model_config", true}, {"transformers_version", config.raw.value("transformers_version", "4.51.0")}};
  if (config.bos_token_id) g["bos_token_id"] = *config.bos_token_id;
  if (config.eos_token_ids.size() == 1)
    g["eos_token_id"] = config.eos_token_ids[0];
  else if (!config.eos_token_ids.empty())
    g["eos_token_id"] = config.eos_token_ids;
  io::write_json_file(dir / "generation_config.json", g);
}

}  // namespace tp
