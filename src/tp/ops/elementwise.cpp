#include "tp/ops/elementwise.h"

#include "tp/autograd/tape.h"
#include "tp/ops/util.h"

namespace tp::ops {

namespace {

// Operand roles after broadcasting: `big` has the result shape, `small`'s shape is a
// suffix of it and repeats every small.numel() elements.
struct Broadcast {
  Shape out_shape;
  bool a_is_big;
  int64_t period;  // numel of the small operand
};

Broadcast broadcast(const Tensor& a, const Tensor& b, const char* op) {
  auto is_suffix = [](const Shape& s, const Shape& of) {
    if (s.size() > of.size()) return false;
    return std::equal(s.begin(), s.end(), of.end() - static_cast<std::ptrdiff_t>(s.size()));
  };
  if (is_suffix(b.shape(), a.shape())) return {a.shape(), true, b.numel()};
  if (is_suffix(a.shape(), b.shape())) return {b.shape(), false, a.numel()};
  fail("{}: shapes {} and {} do not match (equal shapes, or one a trailing part of the other like [N] over [..., N])",
       op, shape_str(a.shape()), shape_str(b.shape()));
}

// Sums g [..., P] over the leading dims down to `shape` (numel P).
Tensor reduce_to(const Tensor& g, const Shape& shape) {
  int64_t p = numel(shape);
  if (p == g.numel()) return g.reshape(shape);
  Tensor r = Tensor::zeros(shape);
  float* d = r.data<float>();
  const float* s = g.data<float>();
  int64_t rows = p == 0 ? 0 : g.numel() / p;
#pragma omp parallel for schedule(static) if (g.numel() > 65536)
  for (int64_t j0 = 0; j0 < p; j0 += 256) {
    int64_t j1 = std::min(p, j0 + 256);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = j0; j < j1; ++j) d[j] += s[i * p + j];
  }
  return r;
}

template <class F>
Tensor binary(const Tensor& a32, const Tensor& b32, const Broadcast& bc, F f) {
  Tensor out = Tensor::empty(bc.out_shape);
  const float* big = (bc.a_is_big ? a32 : b32).data<float>();
  const float* small = (bc.a_is_big ? b32 : a32).data<float>();
  float* o = out.data<float>();
  int64_t n = out.numel(), p = bc.period;
  if (p == 0) return out;
  int64_t rows = n / p;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t r = 0; r < rows; ++r) {
#pragma omp simd
    for (int64_t j = 0; j < p; ++j) o[r * p + j] = f(big[r * p + j], small[j]);
  }
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  check_floating(a, "add");
  check_floating(b, "add");
  Broadcast bc = broadcast(a, b, "add");
  Tensor a32 = a.to(DType::F32), b32 = b.to(DType::F32);
  Tensor out = binary(a32, b32, bc, [](float x, float y) { return x + y; });
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
  Tensor out = binary(a32, b32, bc, [](float x, float y) { return x * y; });
  if (autograd::needs_grad({a, b})) {
    autograd::record("mul", {a, b}, {out}, [a32, b32, bc](const std::vector<Tensor>& g) {
      // d(a*b)/da = g*b, reduced to a's shape when a was the broadcast one.
      const Tensor& big = bc.a_is_big ? a32 : b32;
      const Tensor& small = bc.a_is_big ? b32 : a32;
      Broadcast gb{bc.out_shape, true, bc.period};
      Tensor d_big = binary(g[0], small, gb, [](float x, float y) { return x * y; });
      Tensor d_small = reduce_to(mul_same(g[0], big), small.shape());
      return bc.a_is_big ? std::vector<Tensor>{d_big, d_small} : std::vector<Tensor>{d_small, d_big};
    });
  }
  return out;
}

Tensor scale(const Tensor& x, double s) {
  check_floating(x, "scale");
  Tensor x32 = x.to(DType::F32);
  Tensor out = map_f32(x32, [f = static_cast<float>(s)](float v) { return v * f; });
  if (autograd::needs_grad({x})) {
    autograd::record("scale", {x}, {out}, [s](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{map_f32(g[0], [f = static_cast<float>(s)](float v) { return v * f; })};
    });
  }
  return out;
}

Tensor sum(const Tensor& x) {
  check_floating(x, "sum");
  Tensor x32 = x.to(DType::F32);
  const float* p = x32.data<float>();
  int64_t n = x32.numel();
  double total = 0;
#pragma omp parallel for reduction(+ : total) schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) total += p[i];
  Tensor out = Tensor::full({}, total);
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
  float* o = a.data<float>();
  const float* s = b32.data<float>();
  int64_t n = a.numel(), p = bc.period;
  if (p == 0) return;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t r = 0; r < n / p; ++r) {
#pragma omp simd
    for (int64_t j = 0; j < p; ++j) o[r * p + j] += s[j];
  }
}

}  // namespace tp::ops
