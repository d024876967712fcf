#include "tp/tensor/storage.h"

#include <unistd.h>

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>

#include "tp/core/error.h"

namespace tp {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
// Freed blocks kept for reuse: 4 GiB, or a third of the machine when that is
// more (training a 0.6B model on one rank frees and retakes ~6 GiB per step;
// above the cap every step faults its pages in again, ~10 us per 4 KiB).
size_t max_cached_bytes() {
  static const size_t cap = std::max(size_t{4} << 30, static_cast<size_t>(physical_memory_bytes() / 3));
  return cap;
}

// Free blocks by capacity. A request takes the smallest block at least its size
// and at most twice it, so a steady-state workload stops calling the OS.
struct BlockCache {
  std::mutex mutex;
  std::multimap<size_t, void*> free_blocks;
  AllocatorStats stats;
};

BlockCache& cache() {
  static auto* c = new BlockCache();  // never destroyed: storages may outlive main's statics
  return *c;
}

size_t round_capacity(size_t bytes) {
  if (bytes >= kHugePage) return (bytes + kHugePage - 1) / kHugePage * kHugePage;
  return (bytes + 63) / 64 * 64;
}

void add_tensor_bytes(AllocatorStats& stats, size_t bytes) {
  stats.tensor_bytes += bytes;
  stats.peak_tensor_bytes = std::max(stats.peak_tensor_bytes, stats.tensor_bytes);
}

// Buffers of 2 MiB and more (whole huge pages: round_capacity) come straight
// from mmap, 2 MiB aligned (the mapping made one huge page longer and its ends
// unmapped), and are advised to use huge pages. Through posix_memalign glibc
// wrote its chunk header in the 2 MiB before such a buffer, and where glibc
// advises huge pages for its own mappings (glibc.malloc.hugetlb=1, as tprun
// runs every rank) that header's page became a huge page of its own: up to
// 2 MiB more resident per buffer, 0.17-0.2 GB per rank at the peak of a
// Qwen3-0.6B training step (seq 512, tp 2), whose activations are ~100 buffers.
void* system_allocate(size_t capacity) {
  if (capacity < kHugePage) {
    void* p = nullptr;
    if (posix_memalign(&p, 64, capacity) != 0) fail("out of memory allocating {} bytes", capacity);
    return p;
  }
  const size_t span = capacity + kHugePage;
  void* m = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) fail("out of memory allocating {} bytes (mmap of {} failed)", capacity, span);
  const auto start = reinterpret_cast<uintptr_t>(m);
  const uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > start) munmap(m, aligned - start);
  if (const size_t tail = start + span - (aligned + capacity); tail > 0)
    munmap(reinterpret_cast<void*>(aligned + capacity), tail);
  madvise(reinterpret_cast<void*>(aligned), capacity, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(aligned);
}

// Gives back what system_allocate(capacity) returned.
void system_free(void* p, size_t capacity) {
  if (capacity < kHugePage)
    std::free(p);
  else
    munmap(p, capacity);
}

}  // namespace

std::shared_ptr<Storage> Storage::allocate(size_t bytes) {
  auto s = std::shared_ptr<Storage>(new Storage());
  s->bytes_ = bytes;
  s->take_block();
  return s;
}

// A cached block of at least bytes_ (at most twice it), else a new one from the OS.
void Storage::take_block() {
  size_t capacity = round_capacity(bytes_ == 0 ? 64 : bytes_);
  BlockCache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.free_blocks.lower_bound(capacity);
    if (it != c.free_blocks.end() && it->first <= 2 * capacity) {
      data_ = it->second;
      capacity_ = it->first;
      c.stats.cached_bytes -= it->first;
      c.free_blocks.erase(it);
    }
  }
  if (data_ == nullptr) {
    data_ = system_allocate(capacity);
    capacity_ = capacity;
    std::lock_guard<std::mutex> lock(c.mutex);
    ++c.stats.system_allocations;
    c.stats.system_allocated_bytes += capacity;
  }
  std::lock_guard<std::mutex> lock(c.mutex);
  c.stats.live_bytes += capacity_;
  add_tensor_bytes(c.stats, bytes_);
}

void Storage::give_back_block() {
  BlockCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.stats.live_bytes -= capacity_;
  c.stats.tensor_bytes -= bytes_;
  if (c.stats.cached_bytes + capacity_ > max_cached_bytes()) {
    system_free(data_, capacity_);
  } else {
    c.free_blocks.emplace(capacity_, data_);
    c.stats.cached_bytes += capacity_;
  }
  data_ = nullptr;
  capacity_ = 0;
}

void Storage::release() {
  TP_CHECK(exact_ == 0 && (capacity_ != 0 || released_), "Storage::release: only allocate()'s buffers can be released");
  if (released_) return;
  give_back_block();
  released_ = true;
}

void Storage::restore() {
  if (!released_) return;
  take_block();
  released_ = false;
}

namespace {

// Slabs for allocate_exact: 2 MiB aligned, advised to use huge pages, filled
// back to back. A slab is freed with its last buffer (each buffer owns it),
// and, for the one being filled, once the arena has moved on to the next.
constexpr size_t kSlab = size_t{32} << 20;

struct SlabArena {
  std::mutex mutex;
  std::shared_ptr<char> current;  // the slab new small buffers go into
  size_t used = 0;
};

SlabArena& slab_arena() {
  static auto* a = new SlabArena();  // never destroyed, like the block cache
  return *a;
}

std::shared_ptr<char> new_slab(size_t bytes) {
  return std::shared_ptr<char>(static_cast<char*>(system_allocate(bytes)), [bytes](char* p) { system_free(p, bytes); });
}

}  // namespace

std::shared_ptr<Storage> Storage::allocate_exact(size_t bytes) {
  auto s = std::shared_ptr<Storage>(new Storage());
  const size_t need = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  bool fresh = false;
  if (need > kSlab / 2) {
    // A slab of its own, whole huge pages (< 2 MiB over on > 16 MiB), which
    // goes with the buffer rather than lingering as the arena's current slab.
    std::shared_ptr<char> slab = new_slab(round_capacity(need));
    s->data_ = slab.get();
    s->owner_ = std::move(slab);
    fresh = true;
  } else {
    SlabArena& a = slab_arena();
    std::lock_guard<std::mutex> lock(a.mutex);
    if (a.current == nullptr || a.used + need > kSlab) {
      a.current = new_slab(kSlab);
      a.used = 0;
      fresh = true;
    }
    s->data_ = a.current.get() + a.used;
    s->owner_ = a.current;
    a.used += need;
  }
  s->bytes_ = bytes;
  s->exact_ = need;
  BlockCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (fresh) {
    ++c.stats.system_allocations;
    c.stats.system_allocated_bytes += need > kSlab / 2 ? round_capacity(need) : kSlab;
  }
  c.stats.live_bytes += need;
  add_tensor_bytes(c.stats, bytes);
  return s;
}

std::shared_ptr<Storage> Storage::wrap(void* data, size_t bytes, std::shared_ptr<void> owner) {
  auto s = std::shared_ptr<Storage>(new Storage());
  s->data_ = data;
  s->bytes_ = bytes;
  s->owner_ = std::move(owner);
  return s;
}

Storage::~Storage() {
  if (exact_ != 0) {  // a slab piece: the slab goes when its last piece does (owner_)
    BlockCache& c = cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    c.stats.live_bytes -= exact_;
    c.stats.tensor_bytes -= bytes_;
    return;
  }
  if (capacity_ == 0) return;  // external, or released
  give_back_block();
}

int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : int64_t{1} << 40;
}

AllocatorStats allocator_stats() {
  BlockCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return c.stats;
}

void reset_peak_tensor_bytes() {
  BlockCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.stats.peak_tensor_bytes = c.stats.tensor_bytes;
}

void release_cached_memory() {
  BlockCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  for (auto& [capacity, p] : c.free_blocks) system_free(p, capacity);
  c.free_blocks.clear();
  c.stats.cached_bytes = 0;
}

}  // namespace tp
