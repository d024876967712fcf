#pragma once
// Tensor: a dtype, a shape and a contiguous row-major window into shared
// Storage. Copying a Tensor copies the handle (same tensor, like torch); views
// (reshape, narrow on a contiguous slice) share storage; everything else copies.
//
// The methods here are raw data operations and record nothing for autograd;
// the differentiable versions live in tp/ops (ops::narrow, ops::cat, ...).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tp/tensor/dtype.h"
#include "tp/core/error.h"
#include "tp/tensor/shape.h"
#include "tp/tensor/storage.h"

namespace tp {

namespace autograd {
struct TensorGradState;
}

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  size_t offset = 0;  // bytes from storage->data()
  Shape shape;
  DType dtype = DType::F32;
  // Autograd bookkeeping (see tp/autograd): null for plain tensors.
  std::shared_ptr<autograd::TensorGradState> grad_state;
};

class Tensor {
 public:
  Tensor() = default;  // undefined tensor (no storage)

  // ---- creation
  static Tensor empty(const Shape& shape, DType dtype = DType::F32);
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32);
  static Tensor full(const Shape& shape, double value, DType dtype = DType::F32);
  // Copies `values` (converted to `dtype`); values.size() must equal numel(shape).
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape, DType dtype = DType::F32);
  static Tensor from_ints(const std::vector<int64_t>& values, const Shape& shape, DType dtype = DType::I64);
  // Wraps external memory without copying (e.g. an mmap'd safetensors span).
  static Tensor wrap(std::shared_ptr<Storage> storage, size_t offset, const Shape& shape, DType dtype);
  // Deterministic: the same seed gives the same values on every machine.
  static Tensor randn(const Shape& shape, uint64_t seed, float mean = 0.f, float std = 1.f,
                      DType dtype = DType::F32);
  static Tensor rand(const Shape& shape, uint64_t seed, float low = 0.f, float high = 1.f,
                     DType dtype = DType::F32);
  static Tensor arange(int64_t n, DType dtype = DType::I64);

  // ---- properties
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return tp::numel(shape()); }
  DType dtype() const;
  Device device() const;  // its storage's (tensor/device.h)
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  void* raw_data() const;
  template <class T>
  T* data() const {
    check_dtype(dtype_of<T>::value, "data<T>()");
    return static_cast<T*>(raw_data());
  }
  const std::shared_ptr<Storage>& storage() const;
  size_t storage_offset() const;
  bool same_storage(const Tensor& other) const;
  // True when both handles are the same tensor (not just equal values).
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

  // ---- views (share storage)
  Tensor reshape(const Shape& shape) const;  // one dim may be -1
  Tensor flatten() const { return reshape({numel()}); }
  // Zero-copy when the slice is contiguous (dim 0, or all outer dims of size 1), else a copy.
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  // torch.chunk semantics: chunk = ceil(n / chunks); the last chunks may be smaller or missing.
  std::vector<Tensor> chunk(int64_t chunks, int64_t dim) const;
  Tensor select(int64_t dim, int64_t index) const;  // narrow + drop the dim

  // ---- copies
  Tensor clone() const;
  Tensor to(DType dtype) const;  // returns *this when already of that dtype
  Tensor transpose(int64_t d0, int64_t d1) const;  // copying
  void copy_from(const Tensor& src);  // same numel; converts dtype
  void fill(double value);
  void zero();

  // ---- element access (slow; for tests and small scalars)
  double item() const;  // numel must be 1
  double at(int64_t flat_index) const;
  std::vector<float> to_vector() const;       // converted to f32
  std::vector<int64_t> to_int_vector() const;  // integer dtypes only

  // ---- autograd (see tp/autograd)
  bool requires_grad() const;
  Tensor& set_requires_grad(bool on);
  // Accumulated gradient of a leaf; undefined until a backward reaches it.
  Tensor grad() const;
  void zero_grad();
  // Gives a leaf that requires grad the buffer its gradients accumulate into
  // (same shape; f32 for a bf16 weight whose gradients must not be rounded).
  // A trainer preallocates them once, so no step allocates or faults in pages.
  void set_grad(const Tensor& buffer);

  std::string to_string(int64_t max_elements = 16) const;  // for errors and debugging

  void check_dtype(DType expected, const char* what) const;

 private:
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<TensorImpl> impl_;
};

// Concatenates along `dim`; all other sizes and the dtype must match.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim);

// Size and offset of `index`'s piece when `n` items are split into `parts` by
// torch.chunk's rule (ceil, trailing pieces smaller or empty). The one place
// this rule lives: the loader, DTensor and tests all call it.
struct ChunkSpan {
  int64_t offset;
  int64_t size;
};
ChunkSpan chunk_span(int64_t n, int64_t parts, int64_t index);

// Max |a - b| over all elements (converted to f32); shapes must match.
double max_abs_diff(const Tensor& a, const Tensor& b);
double max_abs(const Tensor& t);
bool equal(const Tensor& a, const Tensor& b);  // same shape, dtype and bytes

// Checks shape equality, naming both shapes and `what` in the error.
void check_same_shape(const Tensor& a, const Tensor& b, const char* what);
void check_same_dtype(const Tensor& a, const Tensor& b, const char* what);

}  // namespace tp
