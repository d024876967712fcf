// Tensor-parallel inference equals one process: for each tiny architecture,
// tp = world size (CTest runs 1..4 ranks) against the same checkpoint loaded
// whole on every rank (a one-rank mesh of its own).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "distributed/dist_test_util.h"
#include "models/model_test_util.h"
#include "tp/distributed/device_mesh.h"
#include "tp/distributed/process_group.h"
#include "tp/generation/generate.h"
#include "tp/models/auto.h"
#include "tp/nn/moe.h"
#include "tp/ops/shape.h"

using namespace tp;
using tp::testing::model_dir;
using tp::testing::solo_mesh;

namespace {

PretrainedModel load(const std::string& name, bool whole) {
  LoadOptions o;
  o.verbose = false;
  if (whole) o.mesh = solo_mesh();
  return AutoModelForCausalLM::from_pretrained(model_dir(name), o);
}

const std::vector<std::vector<int64_t>> kPrompts = {{1, 17, 42, 99, 250, 3, 511}, {7, 300, 12}};

struct ArchCase {
  std::string model;
  double logit_tol;  // relative to the largest |logit|
};

class Equivalence : public ::testing::TestWithParam<ArchCase> {};

// KV-cache decoding equals recomputing: the whole sequence without a cache picks
// the token greedy generation picked at every step.
void expect_recompute_picks(PretrainedModel& model, const std::vector<int64_t>& prompt,
                            const std::vector<int64_t>& generated) {
  std::vector<int64_t> seq = prompt;
  seq.insert(seq.end(), generated.begin(), generated.end() - 1);
  Tensor logits = model.forward(Tensor::from_ints(seq, {1, static_cast<int64_t>(seq.size())}));
  const int64_t V = logits.size(-1);
  for (size_t i = 0; i < generated.size(); ++i) {
    const float* row = logits.data<float>() + (prompt.size() - 1 + i) * V;
    EXPECT_EQ(std::max_element(row, row + V) - row, generated[i]) << "step " << i;
  }
}

}  // namespace

TEST_P(Equivalence, LogitsMatchTp1) {
  PretrainedModel one = load(GetParam().model, true), many = load(GetParam().model, false);
  EXPECT_EQ(many.tp_size(), dist::world_size());
  Tensor ids = Tensor::from_ints({1, 17, 42, 99, 250, 3, 511, 7, 300, 12, 5, 0, 64, 128}, {2, 7});
  Tensor l1 = one.forward(ids), ln = many.forward(ids);
  ASSERT_EQ(l1.shape(), (Shape{2, 7, 516}));
  double scale = max_abs(l1);
  EXPECT_GT(scale, 0.1);
  EXPECT_LE(max_abs_diff(l1, ln), GetParam().logit_tol * scale)
      << GetParam().model << " at tp " << dist::world_size();
}

// ForwardOptions::sharded_logits: each rank's vocabulary slice, starting at
// vocab_start, is its piece of the gathered logits (bit for bit: the same GEMM
// without the all-gather); the next forward, not asking, gathers again.
TEST_P(Equivalence, ShardedLogitsAreTheSlicesOfTheGatheredOnes) {
  PretrainedModel many = load(GetParam().model, false);
  ASSERT_TRUE(many.can_shard_logits());
  Tensor ids = Tensor::from_ints({1, 17, 42, 99, 250, 3, 511, 7, 300, 12, 5, 0, 64, 128}, {2, 7});
  const Tensor full = many.forward(ids);
  const CausalLMOutput sharded = many.forward(ids, {.sharded_logits = true});
  const int64_t V = full.size(-1), local = sharded.logits.size(-1);
  ASSERT_EQ(V % dist::world_size(), 0) << "the tiny models' vocabulary (516) splits evenly over 1-4 ranks";
  EXPECT_EQ(local * dist::world_size(), V) << "a slice per rank";
  ASSERT_LE(sharded.vocab_start + local, V);
  EXPECT_EQ(sharded.vocab_start, dist::world_size() == 1 ? 0 : many.mesh().coordinate("tp") * local);
  EXPECT_TRUE(equal(sharded.logits, ops::narrow(full, 2, sharded.vocab_start, local)))
      << GetParam().model << " at tp " << dist::world_size();
  EXPECT_TRUE(equal(many.forward(ids), full)) << "no state left behind by the sharded forward";
}

// ForwardOptions::output_router_logits: one [B * T, E] tensor per sparse
// layer's router, in layer order, the same at tp N as at tp 1 (the routers are
// replicated); none unless asked, and none for a dense model.
TEST_P(Equivalence, RouterLogitsComeBackWhenAsked) {
  PretrainedModel one = load(GetParam().model, true), many = load(GetParam().model, false);
  std::vector<int64_t> experts;
  for (nn::Module* m : many.lm().modules())
    if (const auto* router = dynamic_cast<const nn::TopKRouter*>(m)) experts.push_back(router->num_experts());
  Tensor ids = Tensor::from_ints({1, 17, 42, 99, 250, 3, 511, 7, 300, 12, 5, 0, 64, 128}, {2, 7});
  const CausalLMOutput a = one.forward(ids, {.output_router_logits = true});
  const CausalLMOutput b = many.forward(ids, {.output_router_logits = true});
  ASSERT_EQ(a.router_logits.size(), experts.size());
  ASSERT_EQ(b.router_logits.size(), experts.size());
  for (size_t i = 0; i < experts.size(); ++i) {
    EXPECT_EQ(b.router_logits[i].shape(), (Shape{14, experts[i]})) << "router " << i;
    EXPECT_LE(max_abs_diff(a.router_logits[i], b.router_logits[i]), GetParam().logit_tol * max_abs(a.router_logits[i]))
        << GetParam().model << " router " << i << " at tp " << dist::world_size();
  }
  EXPECT_TRUE(many.forward(ids, {}).router_logits.empty());
  EXPECT_TRUE(equal(b.logits, many.forward(ids))) << "asking for router logits changes no logit";
  // Their load-balancing loss comes with them (Transformers' aux_loss), the same at tp N.
  EXPECT_EQ(b.aux_loss.defined(), !experts.empty());
  if (!experts.empty()) {
    EXPECT_NEAR(b.aux_loss.item(), a.aux_loss.item(), 1e-5 * std::abs(a.aux_loss.item()));
    EXPECT_GT(a.aux_loss.item(), 0.0);
  }
}

TEST_P(Equivalence, GreedyTokensMatchTp1AndKvCacheEqualsRecompute) {
  PretrainedModel one = load(GetParam().model, true), many = load(GetParam().model, false);
  generation::GenerateOptions opt{.max_new_tokens = 10};
  auto r1 = generation::generate(one, kPrompts, opt);
  auto rn = generation::generate(many, kPrompts, opt);
  EXPECT_EQ(r1.tokens, rn.tokens);
  for (size_t b = 0; b < kPrompts.size(); ++b) {
    ASSERT_EQ(rn.tokens[b].size(), 10u);
    expect_recompute_picks(many, kPrompts[b], rn.tokens[b]);
    // A prompt alone gives what it gave in the padded batch.
    auto alone = generation::generate(many, {kPrompts[b]}, opt);
    EXPECT_EQ(alone.tokens[0], rn.tokens[b]) << "row " << b;
  }
}

TEST_P(Equivalence, SamplingPicksTheSameTokensOnEveryRank) {
  PretrainedModel many = load(GetParam().model, false);
  generation::GenerateOptions opt{.max_new_tokens = 12,
                                  .sampling = {.temperature = 1.5, .top_k = 100, .top_p = 0.95, .seed = 7}};
  auto r = generation::generate(many, kPrompts, opt);
  Tensor mine = Tensor::from_ints(r.tokens[0], {1, 12});
  Tensor all = dist::world().all_gather(mine, 0);
  for (int64_t rank = 0; rank < dist::world_size(); ++rank)
    EXPECT_TRUE(equal(all.narrow(0, rank, 1), mine)) << "rank " << rank << " sampled other tokens";
  // Same seed, same tokens; another seed, other tokens.
  EXPECT_EQ(generation::generate(many, kPrompts, opt).tokens, r.tokens);
  opt.sampling.seed = 8;
  EXPECT_NE(generation::generate(many, kPrompts, opt).tokens, r.tokens);
}

TEST_P(Equivalence, ARowOfABatchWithIdleRowsHasTheBitsOfItsPromptAlone) {
  // What a server's continuous batching relies on (tp/serving/engine.h): one
  // cache of several rows, prompts prefilled on one-row views, then decode
  // steps over rows of different lengths next to an idle row. Every row's
  // logits must be the ones its prompt gets alone.
  PretrainedModel many = load(GetParam().model, false);
  CausalLM& lm = many.lm();
  const std::vector<int64_t> a = kPrompts[0], b = kPrompts[1];
  const int64_t ta = static_cast<int64_t>(a.size()), tb = static_cast<int64_t>(b.size());
  KVState batch = lm.make_kv_state(3, 24);
  std::vector<Tensor> batch_logits;
  for (auto [row, prompt] : {std::pair{0, a}, std::pair{2, b}}) {
    KVState view = batch.rows(row, 1);
    const int64_t t = static_cast<int64_t>(prompt.size());
    batch_logits.push_back(
        lm.forward_ids(Tensor::from_ints(prompt, {1, t}), {.cache = &view, .counts = {t}, .logit_positions = {t - 1}})
            .logits);
    batch.take_lengths(view, row);
  }
  EXPECT_EQ(batch.lengths(), (std::vector<int64_t>{ta, 0, tb}));
  KVState sa = lm.make_kv_state(1, ta + 8), sb = lm.make_kv_state(1, tb + 8);
  Tensor la =
      lm.forward_ids(Tensor::from_ints(a, {1, ta}), {.cache = &sa, .counts = {ta}, .logit_positions = {ta - 1}}).logits;
  Tensor lb =
      lm.forward_ids(Tensor::from_ints(b, {1, tb}), {.cache = &sb, .counts = {tb}, .logit_positions = {tb - 1}}).logits;
  EXPECT_TRUE(equal(batch_logits[0], la));
  EXPECT_TRUE(equal(batch_logits[1], lb));
  for (int step = 0; step < 4; ++step) {
    const int64_t na = 3 + step, nb = 200 + step;
    Tensor lbatch = lm.forward_ids(Tensor::from_ints({na, 0, nb}, {3, 1}),
                                   {.cache = &batch, .counts = {1, 0, 1}, .logit_positions = {0, 0, 0}})
                        .logits;
    la = lm.forward_ids(Tensor::from_ints({na}, {1, 1}), {.cache = &sa, .logit_positions = {0}}).logits;
    lb = lm.forward_ids(Tensor::from_ints({nb}, {1, 1}), {.cache = &sb, .logit_positions = {0}}).logits;
    EXPECT_TRUE(equal(lbatch.narrow(0, 0, 1), la)) << GetParam().model << " step " << step << " row 0";
    EXPECT_TRUE(equal(lbatch.narrow(0, 2, 1), lb)) << GetParam().model << " step " << step << " row 2";
  }
  EXPECT_EQ(batch.lengths(), (std::vector<int64_t>{ta + 4, 0, tb + 4}));
  batch.reset(0);
  EXPECT_EQ(batch.lengths(), (std::vector<int64_t>{0, 0, tb + 4}));
}

TEST_P(Equivalence, APackedStepGivesEachSegmentTheBitsOfItsRowAlone) {
  // A server's step as one packed forward (ForwardOptions::segments): prompt
  // chunks and decode tokens of several rows, in no row order, next to idle
  // rows. Each segment's logits must be the ones its row gets in forwards of
  // its own (the same chunks on a one-row cache), and only named rows grow.
  PretrainedModel many = load(GetParam().model, false);
  CausalLM& lm = many.lm();
  const std::vector<int64_t> a = kPrompts[0], b = kPrompts[1], c = {9, 250, 31, 77, 4, 18, 140},
                             d = {61, 2, 330, 15, 8};
  KVState batch = lm.make_kv_state(5, 24);
  std::vector<KVState> alone;  // a, b, c, d each on a cache of its own
  for (int i = 0; i < 4; ++i) alone.push_back(lm.make_kv_state(1, 24));
  auto forward_alone = [&](int i, const std::vector<int64_t>& tokens) {
    const auto t = static_cast<int64_t>(tokens.size());
    return lm.forward_ids(Tensor::from_ints(tokens, {1, t}), {.cache = &alone[i], .logit_positions = {t - 1}}).logits;
  };
  auto packed = [&](const std::vector<std::pair<int64_t, std::vector<int64_t>>>& parts,
                    const std::vector<int64_t>& logit_positions) {
    ForwardOptions o{.cache = &batch, .logit_positions = logit_positions};
    std::vector<int64_t> ids;
    for (const auto& [row, tokens] : parts) {
      ids.insert(ids.end(), tokens.begin(), tokens.end());
      o.segments.push_back({.row = row, .tokens = static_cast<int64_t>(tokens.size())});
    }
    return lm.forward_ids(Tensor::from_ints(ids, {1, static_cast<int64_t>(ids.size())}), o).logits;
  };
  const std::string model = GetParam().model;
  // Step 1: the prompts of rows 3 and 1 whole (row 1's logits only).
  Tensor l = packed({{3, b}, {1, a}}, {9});
  EXPECT_TRUE(equal(l, forward_alone(0, a))) << model << " step 1, row 1";
  forward_alone(1, b);
  EXPECT_EQ(batch.lengths(), (std::vector<int64_t>{0, 7, 0, 3, 0}));
  // Step 2: c's first chunk on row 4 (no logits), decodes of rows 1 and 3.
  l = packed({{4, {c.begin(), c.begin() + 4}}, {1, {3}}, {3, {200}}}, {4, 5});
  forward_alone(2, {c.begin(), c.begin() + 4});
  EXPECT_TRUE(equal(l.narrow(0, 0, 1), forward_alone(0, {3}))) << model << " step 2, row 1";
  EXPECT_TRUE(equal(l.narrow(0, 1, 1), forward_alone(1, {200}))) << model << " step 2, row 3";
  // Step 3: d whole on row 0, the decodes, and the rest of c.
  l = packed({{0, d}, {3, {201}}, {4, {c.begin() + 4, c.end()}}, {1, {4}}}, {4, 5, 8, 9});
  EXPECT_TRUE(equal(l.narrow(0, 0, 1), forward_alone(3, d))) << model << " step 3, row 0";
  EXPECT_TRUE(equal(l.narrow(0, 1, 1), forward_alone(1, {201}))) << model << " step 3, row 3";
  EXPECT_TRUE(equal(l.narrow(0, 2, 1), forward_alone(2, {c.begin() + 4, c.end()}))) << model << " step 3, row 4";
  EXPECT_TRUE(equal(l.narrow(0, 3, 1), forward_alone(0, {4}))) << model << " step 3, row 1";
  EXPECT_EQ(batch.lengths(), (std::vector<int64_t>{5, 9, 0, 5, 7}));
  // Step 4: one decode on row 4 beside idle rows, as a packed forward of one segment.
  l = packed({{4, {12}}}, {0});
  EXPECT_TRUE(equal(l, forward_alone(2, {12}))) << model << " step 4, row 4";
  EXPECT_EQ(batch.lengths(), (std::vector<int64_t>{5, 9, 0, 5, 8}));
  // Step 5: decodes only, rows 3 and 4 then 0 and 1: two runs of consecutive rows, each one attention call over
  // rows of different lengths.
  l = packed({{3, {202}}, {4, {13}}, {0, {62}}, {1, {5}}}, {0, 1, 2, 3});
  EXPECT_TRUE(equal(l.narrow(0, 0, 1), forward_alone(1, {202}))) << model << " step 5, row 3";
  EXPECT_TRUE(equal(l.narrow(0, 1, 1), forward_alone(2, {13}))) << model << " step 5, row 4";
  EXPECT_TRUE(equal(l.narrow(0, 2, 1), forward_alone(3, {62}))) << model << " step 5, row 0";
  EXPECT_TRUE(equal(l.narrow(0, 3, 1), forward_alone(0, {5}))) << model << " step 5, row 1";
  EXPECT_EQ(batch.lengths(), (std::vector<int64_t>{6, 10, 0, 6, 9}));
  EXPECT_THROW(packed({{1, {5}}, {1, {6}}}, {0}), Error);  // a row twice
}

// should_stop is asked on rank 0 only; its answer rides with the tokens, so
// every rank stops after the same token (tp chat's Ctrl-C).
TEST_P(Equivalence, ShouldStopOnRankZeroStopsEveryRankTogether) {
  PretrainedModel many = load(GetParam().model, false);
  generation::GenerateOptions opt{.max_new_tokens = 10};
  const auto full = generation::generate(many, kPrompts, opt);
  int asked = 0;
  opt.should_stop = [&] { return ++asked == 4 || dist::world().rank() != 0; };  // other ranks' answers are unused
  const auto stopped = generation::generate(many, kPrompts, opt);
  EXPECT_TRUE(stopped.stopped);
  for (size_t b = 0; b < kPrompts.size(); ++b)
    EXPECT_EQ(stopped.tokens[b], std::vector<int64_t>(full.tokens[b].begin(), full.tokens[b].begin() + 3)) << "row " << b;
  EXPECT_FALSE(full.stopped);
}

INSTANTIATE_TEST_SUITE_P(Tiny, Equivalence,
                         ::testing::Values(ArchCase{"llama", 1e-4}, ArchCase{"mistral", 1e-4},
                                          ArchCase{"qwen3", 1e-4},
                                          ArchCase{"qwen2", 1e-4},  // q/k/v biases cut with their rows
                                          // experts cut inside each expert (packed gate/up, rowwise down)
                                          ArchCase{"mixtral", 1e-4}, ArchCase{"qwen3_moe", 1e-4},
                                          // MLA; layer 1 MoE with shared experts (V2 greedy, q-lora
                                          // group-limited; V3 sigmoid noaux_tc, attention replicated)
                                          ArchCase{"deepseek_v2", 1e-4}, ArchCase{"deepseek_v2-q-lora", 1e-4},
                                          // sinks, windowed layers, experts cut on whole interleaved gate/up pairs
                                          ArchCase{"gpt_oss", 1e-4}, ArchCase{"gpt_oss-mxfp4", 1e-4},
                                          ArchCase{"deepseek_v3", 1e-4},
                                          // one KV head (replicated), a window of 4 on layer 0, capped logits
                                          ArchCase{"gemma3", 1e-4},
                                          // the same in Gemma3ForConditionalGeneration's files: sliced reads renamed
                                          ArchCase{"gemma3-vlm", 1e-4},
                                           // bf16 weights: activations are rounded to bf16 before each matmul, and
                                           // the ranks' partial sums are rounded at other points than one rank's.
                                           ArchCase{"llama-bf16", 3e-2}, ArchCase{"gpt_oss-bf16", 3e-2},
                                           // fused q|k|v and gate|up gathered on every rank (Transformers' plan),
                                           // partial rotary dims, LongRoPE's short and long factors
                                           ArchCase{"phi3", 1e-4}, ArchCase{"phi3-long", 1e-4},
                                           ArchCase{"phi3-window", 1e-4}, ArchCase{"phi3-bf16", 3e-2},
                                           // and Gemma's embedding scale rounded to bf16
                                           ArchCase{"gemma3-bf16", 3e-2}),
                         [](const auto& info) {
                           std::string n = info.param.model;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// Phi-3's fused outputs are cut into heads and halves after their projections: a
// plain colwise cut of q|k|v is refused by name; gate|up may also be cut as matching
// gate and up slices (packed_colwise, down_proj rowwise), which equals one rank.
TEST(Phi3Plan, RefusesAColwiseCutOfTheFusedQkv) {
  LoadOptions o;
  o.verbose = false;
  o.distributed_config.tp_plan = R"({"model.layers.*.self_attn.qkv_proj": "colwise"})";
  try {
    AutoModelForCausalLM::from_pretrained(model_dir("phi3"), o);
    ADD_FAILURE() << "expected an error for a colwise qkv_proj";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'model.layers.0.self_attn.qkv_proj' has style 'colwise'"), std::string::npos)
        << e.what();
  }
}

TEST(Phi3Plan, PackedGateUpMatchesOneRank) {
  LoadOptions o;
  o.verbose = false;
  o.distributed_config.tp_plan =
      R"({"model.layers.*.mlp.gate_up_proj": "packed_colwise", "model.layers.*.mlp.down_proj": "rowwise"})";
  PretrainedModel one = load("phi3", true), many = AutoModelForCausalLM::from_pretrained(model_dir("phi3"), o);
  Tensor ids = Tensor::from_ints({1, 17, 42, 99, 250, 3, 511, 7, 300, 12, 5, 0, 64, 128}, {2, 7});
  Tensor l1 = one.forward(ids), ln = many.forward(ids);
  EXPECT_LE(max_abs_diff(l1, ln), 1e-4 * max_abs(l1)) << "at tp " << dist::world_size();
  o.distributed_config.tp_plan = R"({"model.layers.*.mlp.gate_up_proj": "packed_colwise"})";
  EXPECT_THROW(AutoModelForCausalLM::from_pretrained(model_dir("phi3"), o), Error) << "down_proj left rowwise_rep";
}

TEST(KvCacheDtype, FollowsTheWeights) {
  // As in Transformers, the cache keeps the model's dtype: bf16 weights, bf16 keys and values.
  for (auto [name, want] : {std::pair<std::string, DType>{"llama-bf16", DType::BF16}, {"llama", DType::F32}}) {
    PretrainedModel m = load(name, false);
    KVState state = m.lm().make_kv_state(1, 8);
    ASSERT_FALSE(state.layers.empty());
    for (const ops::KVCache& c : state.layers) {
      EXPECT_EQ(c.keys().dtype(), want) << name;
      EXPECT_EQ(c.values().dtype(), want) << name;
    }
  }
}

TEST(KvHeadReplication, TwoKvHeadsOnFourRanksMatchOneRank) {
  const int64_t tp = dist::world_size();
  if (tp == 3) {  // 2 KV heads: 3 neither divides 2 nor is a multiple of it
    try {
      load("qwen3-kv2", false);
      ADD_FAILURE() << "expected an error for 2 KV heads over 3 ranks";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("num_key_value_heads 2"), std::string::npos) << e.what();
    }
    return;
  }
  PretrainedModel one = load("qwen3-kv2", true), many = load("qwen3-kv2", false);
  Tensor ids = Tensor::from_ints({1, 17, 42, 99, 250, 3}, {1, 6});
  Tensor l1 = one.forward(ids), ln = many.forward(ids);
  EXPECT_LE(max_abs_diff(l1, ln), 1e-4 * max_abs(l1));
  generation::GenerateOptions opt{.max_new_tokens = 6};
  EXPECT_EQ(generation::generate(one, kPrompts, opt).tokens, generation::generate(many, kPrompts, opt).tokens);
}

// ---------------------------------------------------------------- expert parallelism

namespace {

struct EpCase {
  std::string model;
  int64_t world;  // the rank count this case runs at (ep_size = world)
  int64_t tp;
  std::string ep_plan = "auto";  // Mixtral ships masked EP; this can switch it to token dispatch
};

class ExpertParallel : public ::testing::TestWithParam<EpCase> {};

PretrainedModel load_ep(const EpCase& c) {
  LoadOptions o;
  o.verbose = false;
  o.distributed_config.tp_size = c.tp;
  o.distributed_config.ep_size = c.world;
  o.distributed_config.ep_plan = c.ep_plan;
  return AutoModelForCausalLM::from_pretrained(model_dir(c.model), o);
}

const std::string kMixtralDispatch =
    R"({"model.layers.*.mlp.gate": "local_params", "model.layers.*.mlp.experts": "ep_dispatch_experts"})";
const std::string kGptOssDispatch =
    R"({"model.layers.*.mlp.router": "local_params", "model.layers.*.mlp.experts": "ep_dispatch_experts"})";

}  // namespace

TEST_P(ExpertParallel, LogitsTokensAndKvCacheMatchOneRank) {
  const EpCase& c = GetParam();
  if (dist::world_size() != c.world) GTEST_SKIP() << "runs at " << c.world << " ranks";
  PretrainedModel one = load(c.model, true), many = load_ep(c);
  EXPECT_EQ(many.tp_size(), c.tp);
  EXPECT_EQ(many.ep_size(), c.world);
  Tensor ids = Tensor::from_ints({1, 17, 42, 99, 250, 3, 511, 7, 300, 12, 5, 0, 64, 128}, {2, 7});
  Tensor l1 = one.forward(ids), ln = many.forward(ids);
  const double scale = max_abs(l1);
  EXPECT_GT(scale, 0.1);
  EXPECT_LE(max_abs_diff(l1, ln), 1e-4 * scale) << c.model << " tp " << c.tp << " ep " << c.world;
  generation::GenerateOptions opt{.max_new_tokens = 8};
  auto r1 = generation::generate(one, kPrompts, opt);
  auto rn = generation::generate(many, kPrompts, opt);
  EXPECT_EQ(r1.tokens, rn.tokens);
  for (size_t b = 0; b < kPrompts.size(); ++b) expect_recompute_picks(many, kPrompts[b], rn.tokens[b]);
}

INSTANTIATE_TEST_SUITE_P(
    Tiny, ExpertParallel,
    ::testing::Values(EpCase{"qwen3_moe", 2, 1}, EpCase{"qwen3_moe", 2, 2}, EpCase{"mixtral", 2, 2},
                      EpCase{"mixtral", 2, 1, kMixtralDispatch}, EpCase{"qwen3_moe", 4, 1}, EpCase{"qwen3_moe", 4, 2},
                      EpCase{"qwen3_moe", 4, 4}, EpCase{"mixtral", 4, 4}, EpCase{"mixtral", 4, 2, kMixtralDispatch},
                      EpCase{"gpt_oss", 2, 2}, EpCase{"gpt_oss", 2, 1, kGptOssDispatch}, EpCase{"gpt_oss", 4, 4},
                      EpCase{"gpt_oss", 4, 2, kGptOssDispatch}, EpCase{"gpt_oss-mxfp4", 2, 2},
                      EpCase{"gpt_oss-mxfp4", 4, 2, kGptOssDispatch},
                      // DeepSeek ships masked EP (ep = tp); token dispatch for the others.
                      EpCase{"deepseek_v2", 2, 2}, EpCase{"deepseek_v2", 2, 1, kMixtralDispatch},
                      EpCase{"deepseek_v2-q-lora", 4, 4}, EpCase{"deepseek_v2-q-lora", 4, 2, kMixtralDispatch},
                      EpCase{"deepseek_v3", 2, 2}, EpCase{"deepseek_v3", 4, 1, kMixtralDispatch},
                      EpCase{"deepseek_v3", 4, 4}),
    [](const auto& info) {
      const EpCase& c = info.param;
      std::string model = c.model;
      std::replace(model.begin(), model.end(), '-', '_');
      return fmt::format("{}_ep{}_tp{}{}", model, c.world, c.tp, c.ep_plan == "auto" ? "" : "_dispatch");
    });
