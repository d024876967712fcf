// The device seam (ops/dispatch.h): an op reaches its arithmetic through its
// family's kernel table, so that a second device only has to fill the table.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "op_test_util.h"
#include "tp/autograd/tape.h"
#include "tp/ops/bf16_rounding.h"
#include "tp/ops/detail/bf16_rounding_kernels.h"
#include "tp/ops/detail/norm_kernels.h"
#include "tp/ops/detail/optimizer_update_kernels.h"
#include "tp/ops/detail/sum_squares_kernels.h"
#include "tp/ops/detail/vocab_parallel_loss_kernels.h"
#include "tp/ops/elementwise.h"
#include "tp/ops/norm.h"
#include "tp/ops/optimizer_updates.h"
#include "tp/ops/sum_squares.h"
#include "tp/ops/vocab_parallel_loss.h"

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
  cases.push_back({"vocab_parallel_loss", lookups_of(ops::vocab_parallel_loss_kernels), [] {
                     Tensor logits = Tensor::randn({2, 5}, 1), target = Tensor::from_ints({3, -100}, {2});
                     Tensor stats = Tensor::zeros({3, 2}), max = stats.select(0, 0), sums = stats.narrow(0, 1, 2);
                     ops::loss_row_max(logits, max);
                     ops::loss_exp_sums(logits, max, target, 0, -100, sums);
                     ops::loss_online_stats(logits, target, 0, -100, max, stats.select(0, 1), stats.select(0, 2));
                     ops::loss_rescale_to_max(max.clone(), max, stats.select(0, 1));
                     ops::loss_total(target, -100, max, stats.select(0, 1), stats.select(0, 2));
                     ops::loss_softmax_grad_(logits, target, 0, -100, max, stats.select(0, 1), 1.f);
                     const ops::LmHeadMath math{DType::BF16, false};
                     Tensor saved = ops::lm_head_saved_input(Tensor::randn({2, 4}, 2), math);
                     Tensor w = Tensor::randn({5, 4}, 3).to(DType::BF16), dh = Tensor::zeros({2, 4}),
                            dw = Tensor::zeros({5, 4});
                     const ops::LmHeadScratch scratch = ops::lm_head_scratch(math, 2, 5, 4, true);
                     ops::lm_head_chunk_logits(saved, w, math, scratch);
                     ops::lm_head_chunk_backward(saved, w, math, target, 0, -100, max, stats.select(0, 1), 1.f,
                                                 scratch, dh, false, dw);
                   }});
  cases.push_back({"sum_squares", lookups_of(ops::sum_squares_kernels), [] {
                     double total = 0;
                     ops::accumulate_sum_squares(Tensor::randn({5}, 1), total);
                   }});
  cases.push_back({"round_to_bf16", lookups_of(ops::bf16_rounding_kernels), [] {
                     ops::round_to_bf16(Tensor::randn({5}, 1), Tensor::empty({5}, DType::BF16));
                   }});
  cases.push_back({"optimizer_update", lookups_of(ops::optimizer_update_kernels), [] {
                     Tensor w = Tensor::randn({5}, 1), g = Tensor::randn({5}, 2), m = Tensor::zeros({5}),
                            v = Tensor::zeros({5});
                     ops::adamw_update({1.f, 0.9f, 0.1f, 0.999f, 0.001f, 1.f, 1e-8f, 0.1f, 1.f}, w, g, m, v);
                     ops::sgd_update({.rate = 0.1f, .momentum = 0.9f, .weight_decay = 0.f, .grad_scale = 1.f,
                                      .first = true}, w, g, m);
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
