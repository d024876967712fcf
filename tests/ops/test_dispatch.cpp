// The device seam (ops/dispatch.h): an op reaches its arithmetic through its
// family's kernel table, so that a second device only has to fill the table.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "op_test_util.h"
#include "tp/autograd/tape.h"
#include "tp/ops/activation.h"
#include "tp/ops/attention.h"
#include "tp/ops/bf16_rounding.h"
#include "tp/ops/detail/activation_kernels.h"
#include "tp/ops/detail/attention_kernels.h"
#include "tp/ops/detail/bf16_rounding_kernels.h"
#include "tp/ops/detail/dropout_kernels.h"
#include "tp/ops/detail/elementwise_kernels.h"
#include "tp/ops/detail/embedding_kernels.h"
#include "tp/ops/detail/linear_kernels.h"
#include "tp/ops/detail/loss_kernels.h"
#include "tp/ops/detail/moe_dispatch_kernels.h"
#include "tp/ops/detail/moe_experts_kernels.h"
#include "tp/ops/detail/mxfp4_kernels.h"
#include "tp/ops/detail/norm_kernels.h"
#include "tp/ops/detail/optimizer_update_kernels.h"
#include "tp/ops/detail/quantized_linear_kernels.h"
#include "tp/ops/detail/rope_kernels.h"
#include "tp/ops/detail/router_loss_kernels.h"
#include "tp/ops/detail/sampling_kernels.h"
#include "tp/ops/detail/shape_kernels.h"
#include "tp/ops/detail/sum_squares_kernels.h"
#include "tp/ops/detail/vocab_parallel_loss_kernels.h"
#include "tp/ops/dropout.h"
#include "tp/ops/elementwise.h"
#include "tp/ops/embedding.h"
#include "tp/ops/linear.h"
#include "tp/ops/loss.h"
#include "tp/ops/moe_dispatch.h"
#include "tp/ops/moe_experts.h"
#include "tp/ops/mxfp4.h"
#include "tp/ops/norm.h"
#include "tp/ops/optimizer_updates.h"
#include "tp/ops/quantized_linear.h"
#include "tp/ops/rope.h"
#include "tp/ops/router_loss.h"
#include "tp/ops/sampling.h"
#include "tp/ops/shape.h"
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
  cases.push_back({"activation", lookups_of(ops::activation_kernels), [] {
                     Tensor x = test::param({3, 8}, 1), y = test::param({3, 8}, 2);
                     forward_backward([&] { return ops::silu(x); });
                     forward_backward([&] { return ops::gelu(x, false); });
                     forward_backward([&] { return ops::gelu(x, true); });
                     forward_backward([&] { return ops::swiglu(x, y); });
                     forward_backward([&] { return ops::softcap(x, 2.0); });
                     forward_backward([&] { return ops::mul(ops::softmax(x, 0), y); });
                   }});
  cases.push_back({"elementwise", lookups_of(ops::elementwise_kernels), [] {
                     Tensor x = test::param({3, 8}, 1), b = test::param({8}, 2);
                     forward_backward([&] { return ops::add(x, b); });
                     forward_backward([&] { return ops::mul(b, x); });
                     forward_backward([&] { return ops::scale(x, 0.5); });
                     Tensor y = Tensor::randn({3, 8}, 3);
                     ops::add_(y, b);
                   }});
  cases.push_back({"embedding", lookups_of(ops::embedding_kernels), [] {
                     Tensor w = test::param({5, 4}, 1), ids = Tensor::from_vector({1, 3, 3}, {3}, DType::I64);
                     forward_backward([&] { return ops::embedding(ids, w, 1); });
                   }});
  cases.push_back({"apply_rope", lookups_of(ops::rope_kernels), [] {
                     Tensor x = test::param({1, 3, 2, 4}, 1), pos = Tensor::from_vector({0, 1, 2}, {1, 3}, DType::I64);
                     forward_backward([&] { return ops::apply_rope(x, pos, ops::rope_inv_freq(4, 10000.0)); });
                   }});
  cases.push_back({"shape", lookups_of(ops::shape_kernels), [] {
                     Tensor x = test::param({3, 8}, 1);
                     forward_backward([&] { return ops::narrow(x, 1, 2, 4); });
                   }});
  cases.push_back({"dropout_mask", lookups_of(ops::dropout_kernels),
                   [] { ops::dropout_mask({2, 4}, 0.5, 7, {0, 0, 4}); }});
  cases.push_back({"mxfp4", lookups_of(ops::mxfp4_kernels), [] {
                     ops::Mxfp4Tensors q = ops::quantise_mxfp4(Tensor::randn({1, 32, 2}, 1));
                     ops::dequantise_mxfp4(q.blocks, q.scales, 0, 32);
                     ops::mxfp4_codes(q.blocks.reshape({2, 1, 16}));
                   }});
  cases.push_back({"moe_dispatch", lookups_of(ops::moe_dispatch_kernels), [] {
                     Tensor ids = Tensor::from_vector({0, 3, 2, 1}, {2, 2}, DType::I64);
                     ops::local_routes(ids, 2, 1);
                     ops::dispatch_order(ids, 2, 2);
                   }});
  cases.push_back({"sampling", lookups_of(ops::sampling_kernels), [] {
                     Tensor logits = Tensor::randn({2, 5}, 1);
                     ops::sample_tokens(logits, {.temperature = 1.0, .seed = 3}, {0, 1}, {0, 0});
                     Tensor c = ops::argmax_candidates(logits, 0, true);
                     ops::best_candidates(c.reshape({1, 2, 2}));
                   }});
  cases.push_back({"router_load_balancing_loss", lookups_of(ops::router_loss_kernels), [] {
                     Tensor logits = test::param({3, 4}, 1);
                     forward_backward([&] { return ops::router_load_balancing_loss({logits}, 2); });
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
