#include "tp/models/checkpoint.h"

#include "tp/io/json_file.h"
#include "tp/models/config_check.h"

namespace tp {

namespace fs = std::filesystem;
using nlohmann::json;

ModelConfig Checkpoint::read_config(const std::filesystem::path& dir) {
  return io::TensorStore::present(dir) ? open(dir).config() : ModelConfig::load(dir / "config.json");
}

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
  TensorIndex index;
  for (const std::string& name : ckpt.tensor_names()) index.emplace(name, &ckpt.info(name));
  check_config_against_weights(ckpt.config(), index, (ckpt.dir() / "config.json").string(), ckpt.dir().string());
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
