#pragma once
// A Hugging Face model directory: config.json plus model.safetensors, or shards
// listed in model.safetensors.index.json. Opening validates every header, the
// index, and the weights' shapes against the config (for architectures whose
// layout tp knows), before any tensor data is read.
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "tp/io/safetensors.h"
#include "tp/models/config.h"

namespace tp::io {

class Checkpoint {
 public:
  static Checkpoint open(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  std::vector<std::string> tensor_names() const;  // file by file, in file order
  bool has(const std::string& name) const { return where_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;  // error names dir + tensor
  const std::vector<std::shared_ptr<SafetensorsFile>>& files() const { return files_; }
  const SafetensorsFile& file_of(const std::string& name) const;
  bool sharded() const { return sharded_; }

  Tensor read(const std::string& name, std::optional<DType> as = {}) const;
  Tensor read_slice(const std::string& name, int64_t dim, const std::vector<ChunkSpan>& spans,
                    std::optional<DType> as = {}) const;

 private:
  struct Location {
    size_t file;
    const TensorInfo* info;
  };
  const Location& locate(const std::string& name) const;

  std::filesystem::path dir_;
  ModelConfig config_;
  bool sharded_ = false;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::unordered_map<std::string, Location> where_;
};

// Checks the weights against the config: every tensor the architecture needs is
// present with the shape the config implies. Unknown model types are not checked.
void validate_against_config(const Checkpoint& ckpt);

}  // namespace tp::io
