#pragma once
// The weight files of a directory: model.safetensors, or the shards listed in
// model.safetensors.index.json. Opening validates every header and the index
// before any tensor data is read. What the tensors mean (config.json, the
// architecture) is the models layer's business (tp/models/checkpoint.h).
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "tp/io/safetensors.h"

namespace tp::io {

class TensorStore {
 public:
  // `prefix` names the files: "model" reads model.safetensors or model.safetensors.index.json.
  static TensorStore open(const std::filesystem::path& dir, const std::string& prefix = "model");
  // Whether `dir` has weight files to open (the single file or the index).
  static bool present(const std::filesystem::path& dir, const std::string& prefix = "model");

  const std::filesystem::path& dir() const { return dir_; }
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
  bool sharded_ = false;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::unordered_map<std::string, Location> where_;
};

}  // namespace tp::io
