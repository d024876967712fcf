#include "tp/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "tp/tensor/convert.h"

namespace tp::io {

namespace {

// Reads of small runs wait on the disk's latency, not on a core: more of them
// in flight than there are cores keeps the device busy.
constexpr int kReadThreads = 8;
constexpr size_t kPieceBytes = 4u << 20;  // a multiple of every dtype size
// Conversions read through a bounce buffer of this size per thread.
constexpr size_t kBounceBytes = 1u << 20;
// Views at least this large have their pages read ahead before use.
constexpr size_t kWarmBytes = 256u << 10;

void pread_all(int fd, void* dst, size_t n, size_t offset, const std::string& file) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, std::min<size_t>(n, 1u << 30), static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    TP_CHECK(r > 0, "{}: read of {} bytes at offset {} failed: {}", file, n, offset,
             r == 0 ? "unexpected end of file (was it truncated?)" : std::strerror(errno));
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<size_t>(r);
  }
}

}  // namespace

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TP_CHECK(fd >= 0, "cannot open {}: {}", path.string(), std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: not a regular file", path.string());
  }
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  f->fd_sequential_ = fd;
  if (f->size_ < 8) parse_safetensors_header(nullptr, f->size_, path);  // throws the "too short" error
  // Private and writable: a caller that writes into a view gets its own copy of
  // the page instead of a crash, and the file is never modified.
  // NORESERVE: copy-on-write pages are rare, so do not charge the whole file
  // against the overcommit limit (several ranks map the same multi-GB shards).
  void* p = mmap(nullptr, f->size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, fd, 0);
  TP_CHECK(p != MAP_FAILED, "cannot mmap {} ({} bytes): {}", path.string(), f->size_, std::strerror(errno));
  f->base_ = static_cast<uint8_t*>(p);
  // Fault-time read-around (8 MiB here) would pull in pages no one asked for,
  // starting with the header's neighbours; views warm their range explicitly.
  madvise(p, f->size_, MADV_RANDOM);
  f->fd_random_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TP_CHECK(f->fd_random_ >= 0, "cannot open {}: {}", path.string(), std::strerror(errno));
  posix_fadvise(f->fd_random_, 0, 0, POSIX_FADV_RANDOM);
  f->header_ = parse_safetensors_header(f->base_, f->size_, path);
  for (size_t i = 0; i < f->header_.tensors.size(); ++i) f->index_[f->header_.tensors[i].name] = i;
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (base_) munmap(base_, size_);
  if (fd_sequential_ >= 0) ::close(fd_sequential_);
  if (fd_random_ >= 0) ::close(fd_random_);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

const TensorInfo& SafetensorsFile::get(const std::string& name) const {
  const TensorInfo* t = find(name);
  TP_CHECK(t, "{}: no tensor named '{}' ({} tensors in the file)", path_.string(), name, header_.tensors.size());
  return *t;
}

Tensor SafetensorsFile::read(const std::string& name, std::optional<DType> as) const {
  const TensorInfo& t = get(name);
  const uint8_t* src = data(t);
  DType out = as.value_or(t.dtype);
  if (out == t.dtype && reinterpret_cast<uintptr_t>(src) % dtype_size(t.dtype) == 0) {
    if (t.nbytes >= kWarmBytes) warm(t);
    std::shared_ptr<Storage> storage;
    {
      std::lock_guard<std::mutex> lock(storage_mutex_);
      storage = storage_.lock();
      if (!storage) {
        storage = Storage::wrap(base_, size_, std::const_pointer_cast<SafetensorsFile>(shared_from_this()));
        storage_ = storage;
      }
    }
    return Tensor::wrap(storage, static_cast<size_t>(src - base_), t.shape, t.dtype);
  }
  return read_slice(t, 0, {}, as);
}

// The kernel caps one WILLNEED request at its readahead window, so a large range
// is requested window by window; the reads proceed asynchronously while the
// caller starts touching the first pages.
void SafetensorsFile::warm(const TensorInfo& info) const {
  constexpr size_t kStep = 4u << 20;
  const size_t begin = header_.data_offset + info.data_begin;
  for (size_t off = 0; off < info.nbytes; off += kStep)
    posix_fadvise(fd_sequential_, static_cast<off_t>(begin + off), static_cast<off_t>(std::min(kStep, info.nbytes - off)),
                  POSIX_FADV_WILLNEED);
}

void SafetensorsFile::read_run(const Run& r, DType in, DType out, uint8_t* out_data) const {
  const std::string file = path_.string();
  // Every run is read with exactly its own pages: a large pread is one large
  // I/O already, and readahead past its end would read pages outside the slice.
  const int fd = fd_random_;
  if (in == out) return pread_all(fd, out_data + r.dst, r.len, r.src, file);
  const size_t in_es = dtype_size(in), out_es = dtype_size(out);
  thread_local std::vector<uint8_t> bounce;
  bounce.resize(kBounceBytes);
  const size_t step = kBounceBytes / in_es * in_es;
  for (size_t done = 0; done < r.len; done += step) {
    const size_t len = std::min(step, r.len - done);
    pread_all(fd, bounce.data(), len, r.src + done, file);
    convert(bounce.data(), in, out_data + r.dst + done / in_es * out_es, out, len / in_es);
  }
}

Tensor SafetensorsFile::read_slice(const std::string& name, int64_t dim, const std::vector<ChunkSpan>& spans,
                                   std::optional<DType> as) const {
  return read_slice(get(name), dim, spans, as);
}

// t [outer, n, inner] around `dim`; out [outer, sum(span sizes), inner]. Each
// (outer index, span) is one contiguous run of bytes, copied (and converted) on
// its own, so only those pages are faulted in. Empty `spans` = the whole tensor.
Tensor SafetensorsFile::read_slice(const TensorInfo& t, int64_t dim, const std::vector<ChunkSpan>& spans_in,
                                   std::optional<DType> as) const {
  const std::string where = fmt::format("{}: tensor '{}' {}", path_.string(), t.name, shape_str(t.shape));
  Shape out_shape = t.shape;
  std::vector<ChunkSpan> spans = spans_in;
  int64_t d = 0;
  if (t.shape.empty()) {
    TP_CHECK(spans.empty(), "{}: cannot slice a 0-d tensor", where);
  } else {
    TP_CHECK(dim >= -static_cast<int64_t>(t.shape.size()) && dim < static_cast<int64_t>(t.shape.size()),
             "{}: slice dim {} out of range for {} dims", where, dim, t.shape.size());
    d = dim < 0 ? dim + static_cast<int64_t>(t.shape.size()) : dim;
    if (spans.empty()) spans.push_back({0, t.shape[d]});
    int64_t total = 0;
    for (const ChunkSpan& s : spans) {
      TP_CHECK(s.offset >= 0 && s.size >= 0 && s.offset + s.size <= t.shape[d],
               "{}: slice [{}, {}) outside dim {} of size {}", where, s.offset, s.offset + s.size, d, t.shape[d]);
      total += s.size;
    }
    out_shape[d] = total;
  }
  const DType out_dtype = as.value_or(t.dtype);
  Tensor out = Tensor::empty(out_shape, out_dtype);
  if (out.numel() == 0) return out;

  const size_t in_es = dtype_size(t.dtype), out_es = dtype_size(out_dtype);
  int64_t outer = 1, inner = 1, n = t.shape.empty() ? 1 : t.shape[d];
  for (int64_t i = 0; i < d; ++i) outer *= t.shape[i];
  for (int64_t i = d + 1; i < static_cast<int64_t>(t.shape.size()); ++i) inner *= t.shape[i];
  if (t.shape.empty()) spans = {{0, 1}};

  // Runs in output order; neighbours that are contiguous in the file merge
  // (a Shard(0) slice or a full-width slice is a single run).
  std::vector<Run> runs;
  const size_t base = header_.data_offset + t.data_begin;
  size_t dst = 0;
  for (int64_t o = 0; o < outer; ++o) {
    for (const ChunkSpan& s : spans) {
      const size_t elems = static_cast<size_t>(s.size * inner);
      if (elems == 0) continue;
      const size_t src = base + static_cast<size_t>((o * n + s.offset) * inner) * in_es;
      if (!runs.empty() && runs.back().src + runs.back().len == src)
        runs.back().len += elems * in_es;
      else
        runs.push_back({src, elems * in_es, dst});
      dst += elems * out_es;
    }
  }
  // Long runs are cut into pieces read in parallel (several I/Os in flight).
  std::vector<Run> pieces;
  for (const Run& r : runs)
    for (size_t done = 0; done < r.len; done += kPieceBytes)
      pieces.push_back({r.src + done, std::min(kPieceBytes, r.len - done), r.dst + done / in_es * out_es});
  runs.swap(pieces);
  uint8_t* out_data = static_cast<uint8_t*>(out.raw_data());
  const int64_t count = static_cast<int64_t>(runs.size());
  // Several small runs in flight at once keep the disk busy (latency bound).
  // Exceptions must not cross the OpenMP region: the first message is kept.
  std::string error;
#pragma omp parallel for schedule(dynamic, 8) num_threads(kReadThreads) if (count > 1)
  for (int64_t i = 0; i < count; ++i) {
    try {
      read_run(runs[i], t.dtype, out_dtype, out_data);
    } catch (const std::exception& e) {
#pragma omp critical(tp_io_read_error)
      if (error.empty()) error = e.what();
    }
  }
  TP_CHECK(error.empty(), "{}", error);
  return out;
}

}  // namespace tp::io
