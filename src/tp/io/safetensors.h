#pragma once
// A safetensors file opened for reading: mmap'd once, header fully validated on
// open. read() without conversion returns a zero-copy view of the mapping;
// copies (slices, conversions) are read with pread(), which issues one large
// I/O per contiguous run: faulting a cold mapping page by page costs ~0.7 ms per
// 4 KiB page on this machine's disk, 30x slower than pread. Sliced reads go
// through a descriptor advised POSIX_FADV_RANDOM, so no readahead pulls in the
// pages between the slice's runs: only the slice's pages are read.
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

  // Start of tensor data in the mapping. Touching cold pages through it faults
  // them in one by one: call warm() first, or use read().
  const uint8_t* data(const TensorInfo& info) const { return base_ + header_.data_offset + info.data_begin; }
  // Asks the kernel to read the tensor's pages ahead (asynchronously).
  void warm(const TensorInfo& info) const;

 private:
  SafetensorsFile() = default;
  // One contiguous run of the file and where it goes in the output.
  struct Run {
    size_t src;  // file offset
    size_t len;  // bytes in the file
    size_t dst;  // byte offset in the output
  };
  void read_run(const Run& r, DType in, DType out, uint8_t* out_data) const;
  const TensorInfo& get(const std::string& name) const;

  std::filesystem::path path_;
  uint8_t* base_ = nullptr;
  int fd_sequential_ = -1;  // readahead on: warm()
  int fd_random_ = -1;      // readahead off: preads read exactly their pages
  size_t size_ = 0;
  SafetensorsHeader header_;
  std::unordered_map<std::string, size_t> index_;
  // One Storage for all views of the mapping, so views of the same file share
  // storage. Weak: the Storage owns this file, a strong pointer would be a cycle.
  mutable std::mutex storage_mutex_;
  mutable std::weak_ptr<Storage> storage_;
};

}  // namespace tp::io
