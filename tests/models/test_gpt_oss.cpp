// GPT-OSS without the multi-rank suite: the config keys it accepts and rejects
// (by message), the plan's cut (whole interleaved gate/up pairs, the sinks of
// each rank's heads), and MXFP4's element order. tp = 1..4 / ep equivalence,
// KV decoding past the window and the PyTorch oracle (bf16 / f32 and MXFP4
// checkpoints) are in test_models and test_reference.
#include <gtest/gtest.h>

#include <cmath>

#include "ops/op_test_util.h"
#include "tp/models/auto.h"
#include "tp/models/mxfp4.h"
#include "tp/models/plan_report.h"
#include "tp/models/presets.h"

using namespace tp;
using tp::test::expect_error;

namespace {

ModelConfig tiny_with(const nlohmann::json& changes) {
  nlohmann::json raw = make_preset_config("gpt_oss", "tiny").to_json();
  for (auto it = changes.begin(); it != changes.end(); ++it) raw[it.key()] = it.value();
  return ModelConfig::from_json(raw, "config.json");
}

const PlanParamRow& row(const PlanReport& r, const std::string& name) {
  for (const PlanParamRow& p : r.parameters)
    if (p.name == name) return p;
  throw Error("no parameter " + name);
}

}  // namespace

TEST(GptOss, ConfigErrorsNameTheKey) {
  expect_error([] { AutoModelForCausalLM::from_config(tiny_with({{"layer_types", {"sliding_attention"}}})); },
               {"config.json", "'layer_types' must list one type per layer (2 layers)"});
  expect_error(
      [] { AutoModelForCausalLM::from_config(tiny_with({{"layer_types", {"full_attention", "chunked_attention"}}})); },
      {"layer_types[1] is \"chunked_attention\"", "supported: \"sliding_attention\", \"full_attention\""});
  expect_error([] { AutoModelForCausalLM::from_config(tiny_with({{"sliding_window", nullptr}})); },
               {"layer_types[0] is \"sliding_attention\" but 'sliding_window' is not set"});
  expect_error([] { AutoModelForCausalLM::from_config(tiny_with({{"swiglu_limit", -1}})); },
               {"'swiglu_limit' must be a positive number, got -1"});
  expect_error([] { AutoModelForCausalLM::from_config(tiny_with({{"num_local_experts", 0}})); },
               {"'num_local_experts' must be a positive integer for model_type gpt_oss, got 0"});
  expect_error([] { AutoModelForCausalLM::from_config(tiny_with({{"num_experts_per_tok", 9}})); },
               {"'num_experts_per_tok' (9) is more than the 8 experts"});
  // The experts' cut needs whole (gate, up) pairs on every rank.
  expect_error([] { make_plan_report(tiny_with({{"intermediate_size", 45}}), {.tp_size = 2}, DType::F32); },
               {"intermediate_size 45 is not divisible by tp_size 2",
                "model.layers.0.mlp.experts.gate_up_proj' [E, H, 2I] is cut on its last dim into whole interleaved "
                "(gate, up) column pairs"});
}

TEST(GptOss, TensorParallelCutsWholeGateUpPairsTheSameIntermediateSliceAndEachRanksSinks) {
  const PlanReport r = make_plan_report(make_preset_config("gpt_oss", "tiny"), {.tp_size = 4}, DType::F32);
  const std::string L = "model.layers.0.";
  // E = 8, H = 64, I = 48: 2I / 4 = 24 columns, i.e. 12 (gate, up) pairs; down_proj's 12 rows of I.
  EXPECT_EQ(row(r, L + "mlp.experts.gate_up_proj").local_shapes[1], (Shape{8, 64, 24}));
  EXPECT_EQ(row(r, L + "mlp.experts.gate_up_proj_bias").local_shapes[1], (Shape{8, 24}));
  EXPECT_EQ(row(r, L + "mlp.experts.down_proj").local_shapes[1], (Shape{8, 12, 64}));
  EXPECT_EQ(row(r, L + "mlp.experts.down_proj_bias").local_shapes[1], (Shape{8, 64}));  // whole: added after the sum
  EXPECT_EQ(row(r, L + "self_attn.sinks").local_shapes[1], (Shape{6}));               // 24 heads / 4
  EXPECT_EQ(row(r, L + "mlp.router.weight").local_shapes[1], (Shape{8, 64}));         // replicated
  // Masked expert parallelism: 2 of 8 experts per rank, biases included.
  const PlanReport ep = make_plan_report(make_preset_config("gpt_oss", "tiny"), {.tp_size = 4, .ep_size = 4},
                                         DType::F32);
  EXPECT_EQ(row(ep, L + "mlp.experts.gate_up_proj").local_shapes[2], (Shape{2, 64, 96}));
  EXPECT_EQ(row(ep, L + "mlp.experts.down_proj_bias").local_shapes[2], (Shape{2, 64}));
}

TEST(Mxfp4, LowNibbleIsTheEvenElementTimesTheBlockScaleThenTransposed) {
  // One expert, 2 out columns, one block of 32 inputs.
  Tensor blocks = Tensor::zeros({1, 2, 1, 16}, DType::U8), scales = Tensor::empty({1, 2, 1}, DType::U8);
  uint8_t* b = blocks.data<uint8_t>();
  b[0] = 0x92;   // element 0: nibble 2 (1.0), element 1: nibble 9 (-0.5)
  b[15] = 0x7F;  // element 30: nibble 15 (-6), element 31: nibble 7 (6)
  b[16] = 0x05;  // column 1, element 0: nibble 5 (3)
  scales.data<uint8_t>()[0] = 128;  // x 2
  scales.data<uint8_t>()[1] = 125;  // x 1/4
  Tensor w = dequantise_mxfp4(blocks, scales, 0, 32);  // [1, 32 in, 2 out]
  ASSERT_EQ(w.shape(), (Shape{1, 32, 2}));
  EXPECT_EQ(w.at(0 * 2 + 0), 2.0);
  EXPECT_EQ(w.at(1 * 2 + 0), -1.0);
  EXPECT_EQ(w.at(30 * 2 + 0), -12.0);
  EXPECT_EQ(w.at(31 * 2 + 0), 12.0);
  EXPECT_EQ(w.at(0 * 2 + 1), 0.75);
  EXPECT_EQ(w.at(2 * 2 + 1), 0.0);
  // A slice of the inputs: rows 30 and 31 only.
  Tensor tail = dequantise_mxfp4(blocks, scales, 30, 2);
  EXPECT_EQ(tail.shape(), (Shape{1, 2, 2}));
  EXPECT_EQ(tail.at(0), -12.0);
  EXPECT_EQ(tail.at(2), 12.0);
}

TEST(Mxfp4, QuantisingRepresentableValuesRoundTripsExactly) {
  // E2M1 values times a per-block power of two survive quantise -> dequantise bit for bit.
  const float e2m1[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  Tensor w = Tensor::empty({2, 64, 3});
  float* p = w.data<float>();
  for (int64_t i = 0; i < w.numel(); ++i) {
    const int64_t in = (i / 3) % 64, block = in / 32;
    const float v = e2m1[(i * 5 + 3) % 8] * std::ldexp(1.f, static_cast<int>(block) - 1);
    p[i] = i % 3 == 1 ? -v : v;
  }
  for (int64_t e = 0; e < 2; ++e)  // every block holds a 6 x its scale, so that the scale is the one chosen
    for (int64_t blk = 0; blk < 2; ++blk)
      for (int64_t o = 0; o < 3; ++o) p[(e * 64 + blk * 32) * 3 + o] = 6.f * std::ldexp(1.f, static_cast<int>(blk) - 1);
  const Mxfp4Tensors q = quantise_mxfp4(w);
  EXPECT_EQ(q.blocks.shape(), (Shape{2, 3, 2, 16}));
  EXPECT_EQ(q.scales.shape(), (Shape{2, 3, 2}));
  Tensor back = dequantise_mxfp4(q.blocks, q.scales, 0, 64);
  EXPECT_EQ(back.to_vector(), w.to_vector());
  expect_error([] { mxfp4_blocks_shape("experts.down_proj", {8, 48, 64}); },
               {"MXFP4 stores 'experts.down_proj' [8, 48, 64] as blocks of 32 along its input dim (dim 1), which must "
                "be a multiple of 32"});
}
