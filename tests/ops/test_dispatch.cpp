// The device seam (ops/dispatch.h): an op reaches its arithmetic through its
// family's kernel table, so that a second device only has to fill the table.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "op_test_util.h"
#include "tp/autograd/tape.h"
#include "tp/ops/attention.h"
#include "tp/ops/detail/attention_kernels.h"
#include "tp/ops/detail/linear_kernels.h"
#include "tp/ops/detail/loss_kernels.h"
#include "tp/ops/detail/moe_experts_kernels.h"
#include "tp/ops/detail/norm_kernels.h"
#include "tp/ops/detail/quantized_linear_kernels.h"
#include "tp/ops/elementwise.h"
#include "tp/ops/linear.h"
#include "tp/ops/loss.h"
#include "tp/ops/moe_experts.h"
#include "tp/ops/norm.h"
#include "tp/ops/quantized_linear.h"

namespace tp {
namespace {

struct FamilyCase {
  std::string name;
  std::function<uint64_t()> lookups;
  std::function<void()> run;  // calls every op of the family, forward and backward
};

template <class Kernels>
std::function<uint64_t()> lookups_of(ops::KernelTable<Kernels>& (*table)()) {
  return [table] { return table().lookups(); };
}

// Runs f(x) and, when x needs a gradient, its backward.
void forward_backward(const std::function<Tensor()>& f) {
  Tensor y = f();
  if (y.requires_grad()) autograd::backward(ops::sum(y));
}

std::vector<FamilyCase> families() {
  std::vector<FamilyCase> cases;
  cases.push_back({"rms_norm", lookups_of(ops::norm_kernels), [] {
                     Tensor x = test::param({3, 8}, 1), w = test::param({8}, 2), d = Tensor::randn({3, 8}, 3);
                     forward_backward([&] { return ops::rms_norm(x, w, 1e-6, 1.0); });
                     Tensor x0 = Tensor::randn({3, 8}, 4), w0 = Tensor::randn({8}, 5);
                     ops::rms_norm(x0, w0, 1e-6, DType::BF16);
                     ops::add_rms_norm(x0, d, w0, 1e-6, DType::F32);
                   }});
  cases.push_back({"cross_entropy", lookups_of(ops::loss_kernels), [] {
                     Tensor logits = test::param({3, 5}, 1);
                     forward_backward([&] { return ops::cross_entropy(logits, Tensor::from_ints({0, -100, 4}, {3})); });
                   }});
  cases.push_back({"attention", lookups_of(ops::attention_kernels), [] {
                     Tensor q = test::param({1, 3, 2, 4}, 1), k = test::param({1, 3, 1, 4}, 2),
                            v = test::param({1, 3, 1, 4}, 3);
                     forward_backward([&] { return ops::attention(q, k, v); });
                     ops::KVCache cache(1, 4, 1, 4, DType::BF16);
                     ops::attention_with_cache(Tensor::randn({1, 1, 2, 4}, 4), cache, Tensor::randn({1, 1, 1, 4}, 5),
                                               Tensor::randn({1, 1, 1, 4}, 6));
                   }});
  cases.push_back({"linear", lookups_of(ops::linear_kernels), [] {
                     Tensor x = test::param({3, 4}, 1), w = test::param({5, 4}, 2), b = test::param({5}, 3);
                     forward_backward([&] { return ops::linear(x, w, b); });
                     forward_backward([&] { return ops::linear(x, w.to(DType::BF16)); });
                     forward_backward([&] { return ops::linear(x, w, Tensor(), DType::BF16); });
                     Tensor m = test::param({4, 2}, 4);
                     forward_backward([&] { return ops::matmul(x, m); });
                     ops::PackedLinear packed(Tensor::randn({5, 4}, 5).to(DType::BF16));
                     forward_backward([&] { return ops::linear(x, packed, b); });
                   }});
  cases.push_back({"quantized_linear", lookups_of(ops::quantized_linear_kernels), [] {
                     // 4-bit codes 0 (zero point 8) in one group of 8 inputs: W = -8 * scale.
                     ops::QuantizedLinear w(4, 8, Tensor::zeros({6, 8}, DType::U8), Tensor::full({6, 1}, 0.5),
                                            Tensor::full({6, 1}, 8, DType::U8));
                     w.dequantize();
                     forward_backward([&] { return ops::linear(test::param({1, 8}, 1), w); });
                     forward_backward([&] { return ops::linear(test::param({9, 8}, 2), w, Tensor(), DType::BF16); });
                   }});
  cases.push_back({"moe_experts", lookups_of(ops::moe_experts_kernels), [] {
                     // 3 tokens, hidden 4, 2 experts of intermediate 3, top 2; expert 2 is the skipped sentinel.
                     Tensor x = test::param({3, 4}, 1), weights = test::param({3, 2}, 2);
                     Tensor gate_up = test::param({2, 6, 4}, 3), down = test::param({2, 4, 3}, 4);
                     Tensor ids = Tensor::from_ints({0, 1, 1, 2, 0, 1}, {3, 2});
                     forward_backward([&] { return ops::moe_experts(x, ids, weights, gate_up, down); });
                     forward_backward([&] { return ops::routed_bias(ids, weights, test::param({2, 4}, 5)); });
                   }});
  cases.push_back({"route_top_k", lookups_of(ops::routing_kernels), [] {
                     Tensor logits = test::param({3, 4}, 1);
                     forward_backward([&] { return ops::route_top_k(logits, {}).weights; });
                     forward_backward([&] { return ops::top_k_softmax(logits, 2).weights; });
                   }});
  return cases;
}

TEST(Dispatch, EveryOpFamilyReachesItsKernelsThroughItsTable) {
  for (const FamilyCase& c : families()) {
    const uint64_t before = c.lookups();
    c.run();
    EXPECT_GT(c.lookups(), before) << c.name << "'s ops ran without asking its kernel table";
  }
}

TEST(Dispatch, AnOpRunsTheKernelsTheTableHoldsForItsDevice) {
  // A CPU entry swapped for one that counts and forwards: the op must call it.
  static int calls = 0;
  static const ops::NormKernels* cpu = nullptr;
  cpu = ops::norm_kernels().get(DeviceType::CPU);
  ops::NormKernels counting = *cpu;
  counting.normalize_rows = [](const Tensor& x, const Tensor& delta, const Tensor& sum, const Tensor& w, double eps,
                               const Tensor& out) {
    ++calls;
    cpu->normalize_rows(x, delta, sum, w, eps, out);
  };
  Tensor x = Tensor::randn({2, 4}, 1), w = Tensor::randn({4}, 2);
  Tensor want = ops::rms_norm(x, w, 1e-6);
  ops::norm_kernels().set(DeviceType::CPU, &counting);
  Tensor got = ops::rms_norm(x, w, 1e-6);
  ops::norm_kernels().set(DeviceType::CPU, cpu);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(got.to_vector(), want.to_vector());
}

TEST(Dispatch, ADeviceWithoutKernelsIsNamedWithTheDtype) {
  const ops::NormKernels* cpu = ops::norm_kernels().get(DeviceType::CPU);
  ops::norm_kernels().set(DeviceType::CPU, nullptr);
  std::string message;
  try {
    ops::rms_norm(Tensor::randn({2, 4}, 1), Tensor::randn({4}, 2), 1e-6);
  } catch (const Error& e) {
    message = e.what();
  }
  ops::norm_kernels().set(DeviceType::CPU, cpu);
  EXPECT_NE(message.find("rms_norm: no kernel for f32 on cpu"), std::string::npos) << message;
}

TEST(Dispatch, TheCommonDeviceSkipsUndefinedTensors) {
  Tensor a = Tensor::randn({2}, 1), none;
  EXPECT_EQ(ops::common_device("op", {&none, &a}), Device{});
  EXPECT_EQ(ops::common_device("op", {&none}), Device{});
}

}  // namespace
}  // namespace tp
