#pragma once
// Byte buffers behind tensors: 64-byte aligned, shared by views. Buffers come
// from a process-wide cache so that a forward pass that runs again reuses the
// same pages (page faults cost ~10 us per 4 KiB page on this machine). Storage
// can also wrap memory owned by someone else (an mmap'd checkpoint).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "tp/tensor/device.h"

namespace tp {

class Storage {
 public:
  // Uninitialized, 64-byte aligned; buffers >= 2 MiB are 2 MiB aligned and
  // advised to use huge pages.
  static std::shared_ptr<Storage> allocate(size_t bytes);
  // For buffers that live as long as the model (packed weights):
  // exactly `bytes` (64-byte multiple), not a cached block up to twice as large
  // nor rounded to whole huge pages (at tp = 2, qwen3-0.6b's 1-3 MB shards wasted
  // ~5 MB per layer that way), yet on huge pages: buffers up to 16 MiB are carved
  // back to back from 32 MiB slabs, 2 MiB aligned and advised (a 1 MB k_proj
  // shard of its own sat on 4 KiB pages, and its decode GEMV missed the TLB every
  // 4 KiB); larger ones get their own slab. A slab is freed with its last buffer
  // (the one being filled stays until the next is begun).
  static std::shared_ptr<Storage> allocate_exact(size_t bytes);
  // Wraps external memory; `owner` is kept alive as long as the storage is.
  static std::shared_ptr<Storage> wrap(void* data, size_t bytes, std::shared_ptr<void> owner);

  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  // Where the bytes are: the CPU, for every buffer the three constructors above make.
  Device device() const { return device_; }

  // Gives an allocate() buffer's memory back while the Storage (and every tensor
  // viewing it) lives on, and takes memory again (uninitialized) for it: FSDP's
  // gathered weights and gradients exist only around their layer, yet a backward
  // closure that captured a weight finds it again (torch's storage resize_(0)).
  void release();
  void restore();
  bool released() const { return released_; }

 private:
  Storage() = default;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  size_t capacity_ = 0;  // allocated size of a cached block (0: external)
  size_t exact_ = 0;     // bytes an allocate_exact piece takes of its slab (owner_)
  std::shared_ptr<void> owner_;
  Device device_;
  bool released_ = false;
  void take_block();
  void give_back_block();
};

// Bytes held by the allocation cache (free, ready for reuse) and in use.
struct AllocatorStats {
  size_t cached_bytes = 0;
  size_t live_bytes = 0;
  size_t system_allocations = 0;  // calls that had to ask the OS for memory
  size_t system_allocated_bytes = 0;  // and what they asked for (each byte is a page fault's worth later)
  // What the live buffers were asked for (live_bytes counts the blocks holding
  // them, up to twice as large), and its high-water mark since the last reset.
  size_t tensor_bytes = 0;
  size_t peak_tensor_bytes = 0;
};
AllocatorStats allocator_stats();
// Starts a new high-water mark of tensor_bytes at its current value (like
// torch.cuda.reset_peak_memory_stats), e.g. to measure one training step.
void reset_peak_tensor_bytes();
// Returns every cached block to the OS.
void release_cached_memory();

// This machine's RAM (the block cache's bound is a fraction of it).
int64_t physical_memory_bytes();

}  // namespace tp
