#pragma once
// Writes safetensors files and Hugging Face model directories that Transformers
// loads: single model.safetensors, or model-0000i-of-0000n.safetensors shards
// plus model.safetensors.index.json above a size limit (Transformers' rule).
#include <cstddef>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tp/models/config.h"
#include "tp/tensor/tensor.h"

namespace tp::io {

// One tensor to write. Either `tensor` is set (its bytes are written as they are)
// or `fill` produces the bytes into a buffer of numel(shape) * dtype_size(dtype):
// the way to write a checkpoint larger than memory one tensor at a time.
struct TensorSource {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  Tensor tensor;
  std::function<void(void* dst)> fill;

  static TensorSource of(std::string name, const Tensor& t);
  size_t nbytes() const { return static_cast<size_t>(numel(shape)) * dtype_size(dtype); }
};

void write_safetensors(const std::filesystem::path& file, const std::vector<TensorSource>& tensors,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});
void save_safetensors(const std::filesystem::path& file, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// Writes config.json and the weights into `dir` (created if needed; weight files
// of an earlier save there are removed first). Single file when the total is
// <= max_shard_bytes, else shards filled greedily in the given order.
void save_checkpoint(const std::filesystem::path& dir, const ModelConfig& config,
                     const std::vector<TensorSource>& tensors, size_t max_shard_bytes = 5ull << 30);
void save_checkpoint(const std::filesystem::path& dir, const ModelConfig& config,
                     const std::vector<std::pair<std::string, Tensor>>& tensors, size_t max_shard_bytes = 5ull << 30);

// generation_config.json as Transformers derives it from the model config.
void save_generation_config(const std::filesystem::path& dir, const ModelConfig& config);

// "5GB" (10^9), "2GiB" (2^30), "500MB", "64KiB", "1000" (bytes): Transformers' spelling.
size_t parse_size(const std::string& text);

}  // namespace tp::io
