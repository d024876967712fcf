#pragma once
// Writes safetensors files, and the weight files of a directory as Transformers
// lays them out: a single model.safetensors, or model-0000i-of-0000n.safetensors
// shards plus model.safetensors.index.json above a size limit (Transformers' rule).
// Each file is written under a temporary name and renamed: whole or not at all.
#include <cstddef>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

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

// Writes the weights into `dir` (which must exist) as <prefix>.safetensors when the
// total is <= max_shard_bytes, else shards filled greedily in the given order plus
// the index; weight files of an earlier save under the same prefix are removed first.
void write_weight_files(const std::filesystem::path& dir, const std::vector<TensorSource>& tensors,
                        size_t max_shard_bytes = 5ull << 30, const std::string& prefix = "model");

// "5GB" (10^9), "2GiB" (2^30), "500MB", "64KiB", "1000" (bytes): Transformers' spelling.
size_t parse_size(const std::string& text);

}  // namespace tp::io
