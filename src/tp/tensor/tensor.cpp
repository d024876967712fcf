#include "tp/tensor/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tp/core/parallel_for.h"
#include "tp/tensor/convert.h"
#include "tp/tensor/random.h"

namespace tp {

namespace {

const TensorImpl& checked(const std::shared_ptr<TensorImpl>& impl) {
  if (!impl) fail("operation on an undefined tensor");
  return *impl;
}

}  // namespace

// ---------------------------------------------------------------- creation

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  for (int64_t s : shape) TP_CHECK(s >= 0, "negative size in shape {}", shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->dtype = dtype;
  impl->storage = Storage::allocate(static_cast<size_t>(tp::numel(shape)) * dtype_size(dtype));
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  std::memset(t.raw_data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype) {
  Tensor t = empty(shape, dtype);
  t.fill(value);
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape, DType dtype) {
  TP_CHECK(static_cast<int64_t>(values.size()) == tp::numel(shape),
           "from_vector: {} values do not fill shape {} ({} elements)", values.size(), shape_str(shape),
           tp::numel(shape));
  Tensor t = empty(shape, dtype);
  convert(values.data(), DType::F32, t.raw_data(), dtype, values.size());
  return t;
}

Tensor Tensor::from_ints(const std::vector<int64_t>& values, const Shape& shape, DType dtype) {
  TP_CHECK(static_cast<int64_t>(values.size()) == tp::numel(shape),
           "from_ints: {} values do not fill shape {} ({} elements)", values.size(), shape_str(shape),
           tp::numel(shape));
  Tensor t = empty(shape, dtype);
  convert(values.data(), DType::I64, t.raw_data(), dtype, values.size());
  return t;
}

Tensor Tensor::wrap(std::shared_ptr<Storage> storage, size_t offset, const Shape& shape, DType dtype) {
  size_t bytes = static_cast<size_t>(tp::numel(shape)) * dtype_size(dtype);
  TP_CHECK(offset + bytes <= storage->bytes(), "wrap: {} bytes at offset {} exceed a storage of {} bytes",
           bytes, offset, storage->bytes());
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->offset = offset;
  impl->shape = shape;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::randn(const Shape& shape, uint64_t seed, float mean, float std, DType dtype) {
  int64_t n = tp::numel(shape);
  std::vector<float> v(static_cast<size_t>(n));
  parallel_for(n, n > 65536, [&](int64_t i) { v[i] = mean + std * static_cast<float>(standard_normal(seed, i)); });
  return from_vector(v, shape, dtype);
}

Tensor Tensor::rand(const Shape& shape, uint64_t seed, float low, float high, DType dtype) {
  int64_t n = tp::numel(shape);
  std::vector<float> v(static_cast<size_t>(n));
  parallel_for(n, n > 65536, [&](int64_t i) { v[i] = low + (high - low) * static_cast<float>(uniform01(seed, i)); });
  return from_vector(v, shape, dtype);
}

Tensor Tensor::arange(int64_t n, DType dtype) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = i;
  return from_ints(v, {n}, dtype);
}

// ---------------------------------------------------------------- properties

const Shape& Tensor::shape() const { return checked(impl_).shape; }
DType Tensor::dtype() const { return checked(impl_).dtype; }
Device Tensor::device() const { return checked(impl_).storage->device(); }
int64_t Tensor::size(int64_t d) const { return shape()[normalize_dim(d, dim())]; }
void* Tensor::raw_data() const {
  const TensorImpl& i = checked(impl_);
  if (i.storage->released()) [[unlikely]]
    fail("a tensor of shape {} reads a released buffer (a parameter of a fully sharded unit that is not gathered)",
         shape_str(i.shape));
  return static_cast<char*>(i.storage->data()) + i.offset;
}
const std::shared_ptr<Storage>& Tensor::storage() const { return checked(impl_).storage; }
size_t Tensor::storage_offset() const { return checked(impl_).offset; }
bool Tensor::same_storage(const Tensor& other) const {
  return defined() && other.defined() && impl_->storage == other.impl_->storage;
}

void Tensor::check_dtype(DType expected, const char* what) const {
  TP_CHECK(dtype() == expected, "{}: expected dtype {}, got {}", what, dtype_name(expected), dtype_name(dtype()));
}

// ---------------------------------------------------------------- views

Tensor Tensor::reshape(const Shape& new_shape) const {
  Shape s = new_shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      TP_CHECK(infer < 0, "reshape {} -> {}: only one dimension may be -1", shape_str(shape()), shape_str(new_shape));
      infer = static_cast<int64_t>(i);
    } else {
      TP_CHECK(s[i] >= 0, "reshape {} -> {}: negative size", shape_str(shape()), shape_str(new_shape));
      known *= s[i];
    }
  }
  if (infer >= 0) {
    TP_CHECK(known > 0 && numel() % known == 0, "reshape {} -> {}: {} elements do not fit", shape_str(shape()),
             shape_str(new_shape), numel());
    s[infer] = numel() / known;
  }
  TP_CHECK(tp::numel(s) == numel(), "reshape {} -> {}: element counts differ ({} vs {})", shape_str(shape()),
           shape_str(new_shape), numel(), tp::numel(s));
  auto impl = std::make_shared<TensorImpl>(*impl_);
  impl->shape = s;
  impl->grad_state = nullptr;
  return Tensor(std::move(impl));
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  int64_t dd = normalize_dim(d, dim());
  int64_t n = shape()[dd];
  TP_CHECK(start >= 0 && length >= 0 && start + length <= n,
           "narrow: [{}, {}) is outside dimension {} of size {} (shape {})", start, start + length, d, n,
           shape_str(shape()));
  Shape out_shape = shape();
  out_shape[dd] = length;
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < dd; ++i) outer *= shape()[i];
  for (int64_t i = dd + 1; i < dim(); ++i) inner *= shape()[i];
  size_t esize = dtype_size(dtype());
  if (outer == 1 || length == n) {
    if (length == n) return *this;
    auto impl = std::make_shared<TensorImpl>(*impl_);
    impl->shape = out_shape;
    impl->offset += static_cast<size_t>(start * inner) * esize;
    impl->grad_state = nullptr;
    return Tensor(std::move(impl));
  }
  Tensor out = empty(out_shape, dtype());
  const char* src = static_cast<const char*>(raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  size_t row = static_cast<size_t>(length * inner) * esize, src_row = static_cast<size_t>(n * inner) * esize;
  size_t skip = static_cast<size_t>(start * inner) * esize;
  parallel_for(outer, outer * length * inner > 65536,
               [&](int64_t o) { std::memcpy(dst + o * row, src + o * src_row + skip, row); });
  return out;
}

ChunkSpan chunk_span(int64_t n, int64_t parts, int64_t index) {
  TP_CHECK(parts > 0, "chunk_span: number of parts must be positive, got {}", parts);
  TP_CHECK(index >= 0 && index < parts, "chunk_span: index {} out of range for {} parts", index, parts);
  int64_t chunk = (n + parts - 1) / parts;
  int64_t offset = std::min(n, chunk * index);
  int64_t end = std::min(n, chunk * (index + 1));
  return {offset, end - offset};
}

std::vector<Tensor> Tensor::chunk(int64_t chunks, int64_t d) const {
  int64_t dd = normalize_dim(d, dim());
  int64_t n = shape()[dd];
  TP_CHECK(chunks > 0, "chunk: number of chunks must be positive, got {}", chunks);
  std::vector<Tensor> out;
  int64_t chunk = std::max<int64_t>(1, (n + chunks - 1) / chunks);
  for (int64_t start = 0; start < n; start += chunk) out.push_back(narrow(dd, start, std::min(chunk, n - start)));
  return out;
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  int64_t dd = normalize_dim(d, dim());
  int64_t i = index < 0 ? index + shape()[dd] : index;
  TP_CHECK(i >= 0 && i < shape()[dd], "select: index {} out of range for dimension {} of size {}", index, d,
           shape()[dd]);
  Tensor t = narrow(dd, i, 1);
  Shape s = shape();
  s.erase(s.begin() + dd);
  return t.reshape(s);
}

// ---------------------------------------------------------------- copies

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), dtype());
  std::memcpy(out.raw_data(), raw_data(), nbytes());
  return out;
}

Tensor Tensor::to(DType target) const {
  if (target == dtype()) return *this;
  Tensor out = empty(shape(), target);
  int64_t n = numel();
  constexpr int64_t kBlock = 1 << 16;
  size_t si = dtype_size(dtype()), so = dtype_size(target);
  const char* src = static_cast<const char*>(raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  parallel_region(n > kBlock, [&] {
#pragma omp for schedule(static)
    for (int64_t b = 0; b < n; b += kBlock) {
      size_t len = static_cast<size_t>(std::min(kBlock, n - b));
      convert(src + b * si, dtype(), dst + b * so, target, len);
    }
  });
  return out;
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  int64_t a = normalize_dim(d0, dim()), b = normalize_dim(d1, dim());
  if (a == b) return clone();
  if (a > b) std::swap(a, b);
  Shape out_shape = shape();
  std::swap(out_shape[a], out_shape[b]);
  Tensor out = empty(out_shape, dtype());
  // View as [outer, A, mid, B, inner] -> [outer, B, mid, A, inner].
  int64_t outer = 1, mid = 1, inner = 1, A = shape()[a], B = shape()[b];
  for (int64_t i = 0; i < a; ++i) outer *= shape()[i];
  for (int64_t i = a + 1; i < b; ++i) mid *= shape()[i];
  for (int64_t i = b + 1; i < dim(); ++i) inner *= shape()[i];
  size_t es = dtype_size(dtype());
  size_t run = static_cast<size_t>(inner) * es;
  const char* src = static_cast<const char*>(raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  parallel_region(numel() > 65536, [&] {
#pragma omp for collapse(2) schedule(static)
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < A; ++i)
        for (int64_t m = 0; m < mid; ++m)
          for (int64_t j = 0; j < B; ++j) {
            int64_t s = (((o * A + i) * mid + m) * B + j) * inner;
            int64_t t = (((o * B + j) * mid + m) * A + i) * inner;
            std::memcpy(dst + t * es, src + s * es, run);
          }
  });
  return out;
}

void Tensor::copy_from(const Tensor& src) {
  TP_CHECK(src.numel() == numel(), "copy_from: source shape {} has {} elements, destination shape {} has {}",
           shape_str(src.shape()), src.numel(), shape_str(shape()), numel());
  convert(src.raw_data(), src.dtype(), raw_data(), dtype(), static_cast<size_t>(numel()));
}

void Tensor::fill(double value) {
  int64_t n = numel();
  if (dtype() == DType::F32) {
    std::fill_n(data<float>(), n, static_cast<float>(value));
    return;
  }
  // Convert one value, then replicate its bytes.
  char one[8];
  if (dtype() == DType::I64 || dtype() == DType::I32) {
    int64_t iv = static_cast<int64_t>(value);
    convert(&iv, DType::I64, one, dtype(), 1);
  } else {
    float fv = static_cast<float>(value);
    convert(&fv, DType::F32, one, dtype(), 1);
  }
  size_t es = dtype_size(dtype());
  char* dst = static_cast<char*>(raw_data());
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * es, one, es);
}

void Tensor::zero() { std::memset(raw_data(), 0, nbytes()); }

// ---------------------------------------------------------------- element access

double Tensor::at(int64_t i) const {
  TP_CHECK(i >= 0 && i < numel(), "index {} out of range for {} elements", i, numel());
  const char* p = static_cast<const char*>(raw_data());
  switch (dtype()) {
    case DType::F32: return reinterpret_cast<const float*>(p)[i];
    case DType::BF16: return to_f32(reinterpret_cast<const bf16*>(p)[i]);
    case DType::F16: return to_f32(reinterpret_cast<const f16*>(p)[i]);
    case DType::I32: return reinterpret_cast<const int32_t*>(p)[i];
    case DType::I64: return static_cast<double>(reinterpret_cast<const int64_t*>(p)[i]);
    case DType::U8: return reinterpret_cast<const uint8_t*>(p)[i];
  }
  return 0;
}

double Tensor::item() const {
  TP_CHECK(numel() == 1, "item() needs exactly one element, tensor has shape {}", shape_str(shape()));
  return at(0);
}

std::vector<float> Tensor::to_vector() const {
  std::vector<float> v(static_cast<size_t>(numel()));
  convert(raw_data(), dtype(), v.data(), DType::F32, v.size());
  return v;
}

std::vector<int64_t> Tensor::to_int_vector() const {
  TP_CHECK(dtype() == DType::I32 || dtype() == DType::I64, "to_int_vector: expected i32 or i64, got {}",
           dtype_name(dtype()));
  std::vector<int64_t> v(static_cast<size_t>(numel()));
  convert(raw_data(), dtype(), v.data(), DType::I64, v.size());
  return v;
}

std::string Tensor::to_string(int64_t max_elements) const {
  if (!defined()) return "Tensor(undefined)";
  std::string s = fmt::format("Tensor({} {} [", dtype_name(dtype()), shape_str(shape()));
  int64_t n = std::min(numel(), max_elements);
  for (int64_t i = 0; i < n; ++i) s += fmt::format("{}{:.6g}", i ? ", " : "", at(i));
  if (n < numel()) s += ", ...";
  return s + "])";
}

// ---------------------------------------------------------------- free functions

Tensor cat(const std::vector<Tensor>& tensors, int64_t d) {
  TP_CHECK(!tensors.empty(), "cat: no tensors given");
  const Tensor& first = tensors[0];
  int64_t dd = normalize_dim(d, first.dim());
  Shape out_shape = first.shape();
  out_shape[dd] = 0;
  for (const Tensor& t : tensors) {
    TP_CHECK(t.dim() == first.dim() && t.dtype() == first.dtype(), "cat: tensor {} {} does not match {} {}",
             dtype_name(t.dtype()), shape_str(t.shape()), dtype_name(first.dtype()), shape_str(first.shape()));
    for (int64_t i = 0; i < first.dim(); ++i)
      TP_CHECK(i == dd || t.shape()[i] == first.shape()[i],
               "cat along dim {}: shape {} does not match {} in dimension {}", d, shape_str(t.shape()),
               shape_str(first.shape()), i);
    out_shape[dd] += t.shape()[dd];
  }
  Tensor out = Tensor::empty(out_shape, first.dtype());
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < dd; ++i) outer *= out_shape[i];
  for (int64_t i = dd + 1; i < first.dim(); ++i) inner *= out_shape[i];
  size_t es = dtype_size(first.dtype());
  size_t out_row = static_cast<size_t>(out_shape[dd] * inner) * es;
  char* dst = static_cast<char*>(out.raw_data());
  size_t col = 0;
  for (const Tensor& t : tensors) {
    size_t row = static_cast<size_t>(t.shape()[dd] * inner) * es;
    const char* src = static_cast<const char*>(t.raw_data());
    for (int64_t o = 0; o < outer; ++o) std::memcpy(dst + o * out_row + col, src + o * row, row);
    col += row;
  }
  return out;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  check_same_shape(a, b, "max_abs_diff");
  std::vector<float> x = a.to_vector(), y = b.to_vector();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double d = std::fabs(static_cast<double>(x[i]) - y[i]);
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (float v : t.to_vector()) m = std::max(m, static_cast<double>(std::fabs(v)));
  return m;
}

bool equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

void check_same_shape(const Tensor& a, const Tensor& b, const char* what) {
  TP_CHECK(a.shape() == b.shape(), "{}: shapes differ: {} vs {}", what, shape_str(a.shape()), shape_str(b.shape()));
}

void check_same_dtype(const Tensor& a, const Tensor& b, const char* what) {
  TP_CHECK(a.dtype() == b.dtype(), "{}: dtypes differ: {} vs {}", what, dtype_name(a.dtype()), dtype_name(b.dtype()));
}

}  // namespace tp
