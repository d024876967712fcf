#pragma once
// Byte buffers behind tensors: 64-byte aligned, shared by views. Buffers come
// from a process-wide cache so that a forward pass that runs again reuses the
// same pages (page faults cost ~10 us per 4 KiB page on this machine). Storage
// can also wrap memory owned by someone else (an mmap'd checkpoint).
#include <cstddef>
#include <functional>
#include <memory>

namespace tp {

class Storage {
 public:
  // Uninitialized, 64-byte aligned; buffers >= 2 MiB are 2 MiB aligned and
  // advised to use huge pages.
  static std::shared_ptr<Storage> allocate(size_t bytes);
  // For buffers that live as long as the model (packed weights): exactly `bytes`
  // (64-byte multiple), fresh from the system rather than a cached block up to
  // twice as large, and not rounded to whole huge pages (at tp = 2, qwen3-0.6b's
  // 1-3 MB shards wasted ~5 MB per layer that way). Aligned and advised as above.
  static std::shared_ptr<Storage> allocate_exact(size_t bytes);
  // Wraps external memory; `owner` is kept alive as long as the storage is.
  static std::shared_ptr<Storage> wrap(void* data, size_t bytes, std::shared_ptr<void> owner);

  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  Storage() = default;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  size_t capacity_ = 0;  // allocated size of a cached block (0: external)
  std::shared_ptr<void> owner_;
};

// Bytes held by the allocation cache (free, ready for reuse) and in use.
struct AllocatorStats {
  size_t cached_bytes = 0;
  size_t live_bytes = 0;
  size_t system_allocations = 0;  // calls that had to ask the OS for memory
};
AllocatorStats allocator_stats();
// Returns every cached block to the OS.
void release_cached_memory();

}  // namespace tp
