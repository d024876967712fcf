#include "tp/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tp/tensor/convert.h"

namespace tp::io {

namespace {

// Asking the kernel to read a range ahead pays off only for large contiguous
// pieces; for small pieces the advice costs more than the faults it saves.
constexpr size_t kWillNeedBytes = 256u << 10;

void will_need(const uint8_t* p, size_t n) {
  if (n < kWillNeedBytes) return;
  uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  uintptr_t b = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  uintptr_t e = reinterpret_cast<uintptr_t>(p) + n;
  madvise(reinterpret_cast<void*>(b), e - b, MADV_WILLNEED);
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
  if (f->size_ < 8) {
    ::close(fd);
    parse_safetensors_header(nullptr, f->size_, path);  // throws the "too short" error
  }
  // Private and writable: a caller that writes into a view gets its own copy of
  // the page instead of a crash, and the file is never modified.
  void* p = mmap(nullptr, f->size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);
  TP_CHECK(p != MAP_FAILED, "cannot mmap {} ({} bytes): {}", path.string(), f->size_, std::strerror(err));
  f->base_ = static_cast<uint8_t*>(p);
  // Readahead would pull in the neighbours of every touched page and defeat
  // sliced reads; full reads ask for their range explicitly (will_need).
  madvise(p, f->size_, MADV_RANDOM);
  f->header_ = parse_safetensors_header(f->base_, f->size_, path);
  for (size_t i = 0; i < f->header_.tensors.size(); ++i) f->index_[f->header_.tensors[i].name] = i;
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (base_) munmap(base_, size_);
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
    will_need(src, t.nbytes);
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

  const uint8_t* src = data(t);
  uint8_t* dst = static_cast<uint8_t*>(out.raw_data());
  for (int64_t o = 0; o < outer; ++o) {
    for (const ChunkSpan& s : spans) {
      const size_t elems = static_cast<size_t>(s.size * inner);
      const uint8_t* piece = src + static_cast<size_t>((o * n + s.offset) * inner) * in_es;
      will_need(piece, elems * in_es);
      if (out_dtype == t.dtype)
        std::memcpy(dst, piece, elems * in_es);
      else
        convert(piece, t.dtype, dst, out_dtype, elems);
      dst += elems * out_es;
    }
  }
  return out;
}

}  // namespace tp::io
