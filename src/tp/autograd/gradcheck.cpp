#include "tp/autograd/gradcheck.h"

#include <cmath>

#include "tp/autograd/tape.h"

namespace tp::autograd {

namespace {

double weighted_sum(const Tensor& out, const Tensor& w) {
  std::vector<float> o = out.to_vector(), ww = w.to_vector();
  double s = 0;
  for (size_t i = 0; i < o.size(); ++i) s += static_cast<double>(o[i]) * ww[i];
  return s;
}

}  // namespace

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn, std::vector<Tensor> inputs,
                          const GradcheckOptions& options) {
  for (Tensor& in : inputs) {
    if (in.defined() && in.requires_grad()) {
      in.check_dtype(DType::F32, "gradcheck input");
      in.zero_grad();
    }
  }
  clear_tape();
  Tensor out = fn(inputs);
  Tensor w = Tensor::randn(out.shape(), options.seed);
  backward(out, w);

  NoGradGuard no_grad;
  for (size_t k = 0; k < inputs.size(); ++k) {
    Tensor& in = inputs[k];
    if (!in.defined() || !in.requires_grad()) continue;
    Tensor analytic = in.grad();
    if (!analytic.defined()) analytic = Tensor::zeros(in.shape());
    std::vector<float> a = analytic.to_vector();
    Tensor flat = in.flatten();  // a view: setting an element moves the input
    for (int64_t i = 0; i < in.numel(); ++i) {
      Tensor x = flat.narrow(0, i, 1);
      const auto saved = static_cast<float>(x.item());
      x.fill(saved + static_cast<float>(options.eps));
      double plus = weighted_sum(fn(inputs), w);
      x.fill(saved - static_cast<float>(options.eps));
      double minus = weighted_sum(fn(inputs), w);
      x.fill(saved);
      double numeric = (plus - minus) / (2 * options.eps);
      double diff = std::fabs(a[i] - numeric);
      if (!(diff <= options.atol + options.rtol * std::fabs(numeric))) {
        return {false, fmt::format("input {} (shape {}), element {}: analytic {:.6g} vs numeric {:.6g}", k,
                                   shape_str(in.shape()), i, a[i], numeric)};
      }
    }
  }
  return {};
}

}  // namespace tp::autograd
