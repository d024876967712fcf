#include "tp/models/checkpoint.h"

#include "tp/io/json_file.h"
#include "tp/models/config_check.h"
#include "tp/models/gemma3.h"

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
  const json raw = io::read_json_file(dir / "config.json");
  const bool multimodal = is_gemma3_multimodal(raw);
  c.config_ = multimodal ? ModelConfig::from_json(gemma3_text_config_of(raw), (dir / "config.json").string() +
                                                                               " (its text_config)")
                         : ModelConfig::load(dir / "config.json");
  c.weights_ = io::TensorStore::open(dir);
  if (multimodal) {
    // Hub files as Google published them, or as Transformers >= 4.52 saves them.
    if (c.weights_.has("language_model.model.embed_tokens.weight")) {
      c.renames_ = {{"model.", "language_model.model."}, {"lm_head.", "language_model.lm_head."}};
    } else {
      TP_CHECK(c.weights_.has("model.language_model.embed_tokens.weight"),
               "{}: a multimodal gemma3 checkpoint, but its weights hold neither "
               "'language_model.model.embed_tokens.weight' nor 'model.language_model.embed_tokens.weight'",
               dir.string());
      c.renames_ = {{"model.", "model.language_model."}};
    }
  }
  validate_against_config(c);
  return c;
}

std::string Checkpoint::stored(const std::string& name) const {
  for (const auto& [tree, hub] : renames_)
    if (name.rfind(tree, 0) == 0) return hub + name.substr(tree.size());
  return name;
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> names = weights_.tensor_names();
  if (renames_.empty()) return names;
  std::vector<std::string> out;
  for (const std::string& n : names)
    for (const auto& [tree, hub] : renames_)
      if (n.rfind(hub, 0) == 0) {
        out.push_back(tree + n.substr(hub.size()));
        break;
      }
  return out;
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
