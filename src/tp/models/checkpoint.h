#pragma once
// A Hugging Face model directory: config.json plus the weight files
// (io::TensorStore). Opening validates the config, every header, the index, and
// the weights' shapes against the config (for architectures whose layout tp
// knows), before any tensor data is read. Saving writes the same layout back.
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tp/io/tensor_store.h"
#include "tp/io/writer.h"
#include "tp/models/config.h"

namespace tp {

class Checkpoint {
 public:
  static Checkpoint open(const std::filesystem::path& dir);
  // The model's config without reading weights: checked against the weights'
  // headers when `dir` has any (open(dir).config()), else config.json alone.
  static ModelConfig read_config(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return weights_.dir(); }
  const ModelConfig& config() const { return config_; }
  const io::TensorStore& weights() const { return weights_; }

  // Tensor names as the model tree has them. A vision-language checkpoint
  // (Gemma3ForConditionalGeneration) is read as its language model: its text
  // config, its language model's tensors under their causal-LM names (stored
  // as language_model.model.* or model.language_model.*), the vision tower's unseen.
  std::vector<std::string> tensor_names() const;
  bool has(const std::string& name) const { return weights_.has(stored(name)); }
  const io::TensorInfo& info(const std::string& name) const { return weights_.info(stored(name)); }
  const std::vector<std::shared_ptr<io::SafetensorsFile>>& files() const { return weights_.files(); }
  const io::SafetensorsFile& file_of(const std::string& name) const { return weights_.file_of(stored(name)); }
  bool sharded() const { return weights_.sharded(); }
  Tensor read(const std::string& name, std::optional<DType> as = {}) const { return weights_.read(stored(name), as); }
  Tensor read_slice(const std::string& name, int64_t dim, const std::vector<ChunkSpan>& spans,
                    std::optional<DType> as = {}) const {
    return weights_.read_slice(stored(name), dim, spans, as);
  }

 private:
  std::string stored(const std::string& name) const;  // the name in the files
  ModelConfig config_;
  io::TensorStore weights_;
  std::vector<std::pair<std::string, std::string>> renames_;  // tree prefix -> stored prefix (multimodal)
};

// Checks the config against the weights' tensor index (tp/models/config_check.h):
// a contradiction is an error before any module is built. Unknown model types
// are not checked.
void validate_against_config(const Checkpoint& ckpt);

// Writes config.json and the weights into `dir` (created if needed; weight files
// of an earlier save there are removed first). Single file when the total is
// <= max_shard_bytes, else shards filled greedily in the given order.
void save_checkpoint(const std::filesystem::path& dir, const ModelConfig& config,
                     const std::vector<io::TensorSource>& tensors, size_t max_shard_bytes = 5ull << 30);
void save_checkpoint(const std::filesystem::path& dir, const ModelConfig& config,
                     const std::vector<std::pair<std::string, Tensor>>& tensors, size_t max_shard_bytes = 5ull << 30);

// generation_config.json as Transformers derives it from the model config.
void save_generation_config(const std::filesystem::path& dir, const ModelConfig& config);

}  // namespace tp
