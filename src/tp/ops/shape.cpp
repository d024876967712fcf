#include "tp/ops/shape.h"

#include <cstring>

#include "tp/autograd/tape.h"
#include "tp/ops/detail/shape_kernels.h"
#include "tp/ops/util.h"

namespace tp::ops {

namespace {

// ---- CPU kernels

// Copies g into dx's slice, in outer blocks of `length * inner`.
void narrow_backward_cpu(const Tensor& g, int64_t d, int64_t start, const Tensor& dx) {
  const Shape& in_shape = dx.shape();
  const int64_t length = g.size(d);
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < d; ++i) outer *= in_shape[i];
  for (size_t i = d + 1; i < in_shape.size(); ++i) inner *= in_shape[i];
  const float* s = g.data<float>();
  float* t = dx.data<float>();
  int64_t n = in_shape[d];
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(t + (o * n + start) * inner, s + o * length * inner, sizeof(float) * length * inner);
}

constexpr ShapeKernels kCpuShapeKernels{narrow_backward_cpu};

}  // namespace

KernelTable<ShapeKernels>& shape_kernels() {
  static KernelTable<ShapeKernels> table("shape", &kCpuShapeKernels);
  return table;
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  Tensor out = x.reshape(shape);  // always a new handle
  if (autograd::needs_grad({x})) {
    Shape in_shape = x.shape();
    autograd::record("reshape", {x}, {out}, [in_shape](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{g[0].reshape(in_shape)};
    });
  }
  return out;
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  Tensor out = fresh_handle(x.narrow(dim, start, length));
  if (autograd::needs_grad({x})) {
    int64_t d = normalize_dim(dim, x.dim());
    Shape in_shape = x.shape();
    autograd::record("narrow", {x}, {out}, [in_shape, d, start](const std::vector<Tensor>& g) {
      // g scattered into a zero tensor of x's shape.
      Tensor dx = Tensor::zeros(in_shape);
      shape_kernels().on(g[0]).narrow_backward(g[0], d, start, dx);
      return std::vector<Tensor>{dx};
    });
  }
  return out;
}

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  TP_CHECK(!xs.empty(), "cat: no tensors given");
  Tensor out = fresh_handle(tp::cat(xs, dim));
  if (autograd::needs_grad(xs)) {
    int64_t d = normalize_dim(dim, xs[0].dim());
    std::vector<int64_t> sizes;
    for (const Tensor& x : xs) sizes.push_back(x.size(d));
    autograd::record("cat", xs, {out}, [d, sizes](const std::vector<Tensor>& g) {
      std::vector<Tensor> grads;
      int64_t offset = 0;
      for (int64_t s : sizes) {
        grads.push_back(g[0].narrow(d, offset, s));
        offset += s;
      }
      return grads;
    });
  }
  return out;
}

Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  Tensor out = fresh_handle(x.transpose(d0, d1));
  if (autograd::needs_grad({x})) {
    autograd::record("transpose", {x}, {out}, [d0, d1](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{g[0].transpose(d0, d1)};
    });
  }
  return out;
}

Tensor to_dtype(const Tensor& x, DType dtype) {
  Tensor out = fresh_handle(x.to(dtype));
  if (autograd::needs_grad({x})) {
    DType in = x.dtype();
    autograd::record("to_dtype", {x}, {out}, [in](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{g[0].to(in)};
    });
  }
  return out;
}

}  // namespace tp::ops
