#include "tp/ops/elementwise.h"

#include <algorithm>

#include "tp/autograd/tape.h"
#include "tp/core/parallel_for.h"
#include "tp/ops/detail/elementwise_kernels.h"
#include "tp/ops/util.h"

namespace tp::ops {

namespace {

// Operand roles after broadcasting: `big` has the result shape, `small`'s shape is a
// suffix of it and repeats every small.numel() elements.
struct Broadcast {
  Shape out_shape;
  bool a_is_big;
};

Broadcast broadcast(const Tensor& a, const Tensor& b, const char* op) {
  auto is_suffix = [](const Shape& s, const Shape& of) {
    if (s.size() > of.size()) return false;
    return std::equal(s.begin(), s.end(), of.end() - static_cast<std::ptrdiff_t>(s.size()));
  };
  if (is_suffix(b.shape(), a.shape())) return {a.shape(), true};
  if (is_suffix(a.shape(), b.shape())) return {b.shape(), false};
  fail("{}: shapes {} and {} do not match (equal shapes, or one a trailing part of the other like [N] over [..., N])",
       op, shape_str(a.shape()), shape_str(b.shape()));
}

// ---- CPU kernels

// out [P] = the sum of g [..., P]'s rows, in column blocks so threads never share an element.
void sum_rows_cpu(const Tensor& g, const Tensor& out) {
  int64_t p = out.numel();
  float* d = out.data<float>();
  std::fill(d, d + p, 0.f);
  const float* s = g.data<float>();
  int64_t rows = p == 0 ? 0 : g.numel() / p;
  parallel_region(g.numel() > 65536, [&] {
#pragma omp for schedule(static)
    for (int64_t j0 = 0; j0 < p; j0 += 256) {
      int64_t j1 = std::min(p, j0 + 256);
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = j0; j < j1; ++j) d[j] += s[i * p + j];
    }
  });
}

// out[r, j] = f(big[r, j], small[j]) over the rows of `small.numel()` elements.
template <class F>
void binary(const Tensor& big_t, const Tensor& small_t, const Tensor& out, F f) {
  const float* big = big_t.data<float>();
  const float* small = small_t.data<float>();
  float* o = out.data<float>();
  int64_t n = out.numel(), p = small_t.numel();
  if (p == 0) return;
  int64_t rows = n / p;
  parallel_for(rows, n > 65536, [&](int64_t r) {
#pragma omp simd
    for (int64_t j = 0; j < p; ++j) o[r * p + j] = f(big[r * p + j], small[j]);
  });
}

constexpr auto plus = [](float x, float y) { return x + y; };
constexpr auto times = [](float x, float y) { return x * y; };

void add_cpu(const Tensor& big, const Tensor& small, const Tensor& out) { binary(big, small, out, plus); }
void mul_cpu(const Tensor& big, const Tensor& small, const Tensor& out) { binary(big, small, out, times); }

void mul_backward_cpu(const Tensor& g, const Tensor& big, const Tensor& small, const Tensor& d_big,
                      const Tensor& d_small) {
  binary(g, small, d_big, times);
  if (d_small.numel() == g.numel()) {
    zip_f32(g, big, d_small, times);
    return;
  }
  Tensor product = Tensor::empty(g.shape());
  zip_f32(g, big, product, times);
  sum_rows_cpu(product, d_small);
}

void scale_cpu(const Tensor& x, float f, const Tensor& out) {
  map_f32(x, out, [f](float v) { return v * f; });
}

void sum_cpu(const Tensor& x, const Tensor& out) {
  const float* p = x.data<float>();
  int64_t n = x.numel();
  double total = 0;
#pragma omp parallel for reduction(+ : total) schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) total += p[i];
  *out.data<float>() = static_cast<float>(total);
}

void add_into_cpu(const Tensor& a, const Tensor& small) {
  float* o = a.data<float>();
  const float* s = small.data<float>();
  int64_t n = a.numel(), p = small.numel();
  if (p == 0) return;
  parallel_for(n / p, n > 65536, [&](int64_t r) {
#pragma omp simd
    for (int64_t j = 0; j < p; ++j) o[r * p + j] += s[j];
  });
}

constexpr ElementwiseKernels kCpuElementwiseKernels{add_cpu,   mul_cpu, mul_backward_cpu, sum_rows_cpu,
                                                    scale_cpu, sum_cpu, add_into_cpu};

// ---- the ops

// g summed over its leading dims down to `shape` (numel P).
Tensor reduce_to(const Tensor& g, const Shape& shape) {
  if (numel(shape) == g.numel()) return g.reshape(shape);
  Tensor r = Tensor::empty(shape);
  elementwise_kernels().on(g).sum_rows(g, r);
  return r;
}

}  // namespace

KernelTable<ElementwiseKernels>& elementwise_kernels() {
  static KernelTable<ElementwiseKernels> table("elementwise", &kCpuElementwiseKernels);
  return table;
}

Tensor add(const Tensor& a, const Tensor& b) {
  check_floating(a, "add");
  check_floating(b, "add");
  Broadcast bc = broadcast(a, b, "add");
  Tensor a32 = a.to(DType::F32), b32 = b.to(DType::F32);
  Tensor out = Tensor::empty(bc.out_shape);
  const Tensor& big = bc.a_is_big ? a32 : b32;
  const Tensor& small = bc.a_is_big ? b32 : a32;
  elementwise_kernels().on(big, small).add(big, small, out);
  if (autograd::needs_grad({a, b})) {
    Shape sa = a.shape(), sb = b.shape();
    autograd::record("add", {a, b}, {out}, [sa, sb](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{reduce_to(g[0], sa), reduce_to(g[0], sb)};
    });
  }
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  check_floating(a, "mul");
  check_floating(b, "mul");
  Broadcast bc = broadcast(a, b, "mul");
  Tensor a32 = a.to(DType::F32), b32 = b.to(DType::F32);
  Tensor out = Tensor::empty(bc.out_shape);
  const Tensor& big = bc.a_is_big ? a32 : b32;
  const Tensor& small = bc.a_is_big ? b32 : a32;
  elementwise_kernels().on(big, small).mul(big, small, out);
  if (autograd::needs_grad({a, b})) {
    autograd::record("mul", {a, b}, {out}, [a32, b32, bc](const std::vector<Tensor>& g) {
      // d(a*b)/da = g*b, reduced to a's shape when a was the broadcast one.
      const Tensor& big = bc.a_is_big ? a32 : b32;
      const Tensor& small = bc.a_is_big ? b32 : a32;
      Tensor d_big = Tensor::empty(bc.out_shape), d_small = Tensor::empty(small.shape());
      elementwise_kernels().on(g[0], big, small).mul_backward(g[0], big, small, d_big, d_small);
      return bc.a_is_big ? std::vector<Tensor>{d_big, d_small} : std::vector<Tensor>{d_small, d_big};
    });
  }
  return out;
}

Tensor scale(const Tensor& x, double s) {
  check_floating(x, "scale");
  Tensor x32 = x.to(DType::F32);
  Tensor out = Tensor::empty(x32.shape());
  elementwise_kernels().on(x32).scale(x32, static_cast<float>(s), out);
  if (autograd::needs_grad({x})) {
    autograd::record("scale", {x}, {out}, [s](const std::vector<Tensor>& g) {
      Tensor dx = Tensor::empty(g[0].shape());
      elementwise_kernels().on(g[0]).scale(g[0], static_cast<float>(s), dx);
      return std::vector<Tensor>{dx};
    });
  }
  return out;
}

Tensor sum(const Tensor& x) {
  check_floating(x, "sum");
  Tensor x32 = x.to(DType::F32);
  Tensor out = Tensor::empty({});
  elementwise_kernels().on(x32).sum(x32, out);
  if (autograd::needs_grad({x})) {
    Shape shape = x.shape();
    autograd::record("sum", {x}, {out}, [shape](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{Tensor::full(shape, g[0].item())};
    });
  }
  return out;
}

void add_(Tensor& a, const Tensor& b) {
  TP_CHECK(a.defined() && a.dtype() == DType::F32, "add_: the destination must be f32, got {}",
           a.defined() ? dtype_name(a.dtype()) : "undefined");
  check_floating(b, "add_");
  Broadcast bc = broadcast(a, b, "add_");
  TP_CHECK(bc.a_is_big, "add_: cannot broadcast the destination {} up to {}", shape_str(a.shape()),
           shape_str(b.shape()));
  Tensor b32 = b.to(DType::F32);
  elementwise_kernels().on(a, b32).add_into(a, b32);
}

}  // namespace tp::ops
