#pragma once
// A safetensors file opened for reading: mmap'd once, header fully validated on
// open. Reads return a zero-copy view of the mapping when no conversion is asked,
// else a converted copy; sliced reads touch only the pages of their slice.
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "tp/io/safetensors_header.h"
#include "tp/tensor/tensor.h"

namespace tp::io {

class SafetensorsFile : public std::enable_shared_from_this<SafetensorsFile> {
 public:
  static std::shared_ptr<SafetensorsFile> open(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  size_t file_size() const { return size_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }  // in file order
  const TensorInfo* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }

  // The whole tensor: a view of the mapping, or a converted copy when `as` differs.
  Tensor read(const std::string& name, std::optional<DType> as = {}) const;
  // Reads only the bytes of the given spans along `dim` and concatenates them along
  // `dim` (one span = Shard; several = StridedShard groups). Touches only those pages.
  Tensor read_slice(const std::string& name, int64_t dim, const std::vector<ChunkSpan>& spans,
                    std::optional<DType> as = {}) const;
  // As above for a TensorInfo of this file (the checkpoint has already looked it up).
  Tensor read_slice(const TensorInfo& info, int64_t dim, const std::vector<ChunkSpan>& spans,
                    std::optional<DType> as = {}) const;

  // Start of tensor data in the mapping (for scanning without copying).
  const uint8_t* data(const TensorInfo& info) const { return base_ + header_.data_offset + info.data_begin; }

 private:
  SafetensorsFile() = default;
  const TensorInfo& get(const std::string& name) const;

  std::filesystem::path path_;
  uint8_t* base_ = nullptr;
  size_t size_ = 0;
  SafetensorsHeader header_;
  std::unordered_map<std::string, size_t> index_;
  // One Storage for all views of the mapping, so views of the same file share
  // storage. Weak: the Storage owns this file, a strong pointer would be a cycle.
  mutable std::mutex storage_mutex_;
  mutable std::weak_ptr<Storage> storage_;
};

}  // namespace tp::io
