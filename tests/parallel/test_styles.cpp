// Every parallel style at tp = world size (CTest runs 1..4 ranks) against the
// same module run whole on one rank: outputs, input gradients and parameter
// gradients must match. Each rank computes the serial reference itself from the
// same seeded tensors.
#include <gtest/gtest.h>

#include "distributed/dist_test_util.h"
#include "tp/autograd/tape.h"
#include "tp/distributed/device_mesh.h"
#include "tp/distributed/process_group.h"
#include "tp/nn/layers.h"
#include "tp/ops/activation.h"
#include "tp/ops/attention.h"
#include "tp/ops/elementwise.h"
#include "tp/ops/shape.h"
#include "tp/parallel/apply.h"
#include "tp/parallel/colwise.h"
#include "tp/parallel/registry.h"

using namespace tp;
using dist::testing::expect_close;

namespace {

constexpr double kTol = 1e-5;

const dist::DeviceMesh& tp_only_mesh() {
  static const dist::DeviceMesh m = dist::DeviceMesh::tp_mesh(dist::world_size());
  return m;
}
// The mesh styles are applied on; a test may point it at a mesh with more dims.
const dist::DeviceMesh* current_mesh = nullptr;
const dist::DeviceMesh& mesh() { return current_mesh ? *current_mesh : tp_only_mesh(); }
nn::TpRank tp_rank() { return {dist::world_size(), dist::world_rank()}; }

// This rank's piece of `full` as a style's shard describes it.
Tensor take_shard(const Tensor& full, const nn::ParamShard& s) {
  if (s.replicated()) return full.clone();
  std::vector<Tensor> parts;
  for (const ChunkSpan& span : s.spans) parts.push_back(full.narrow(s.dim, span.offset, span.size));
  return (parts.size() == 1 ? parts[0] : cat(parts, s.dim)).clone();
}

// Pieces of `full` along `dim` for this rank: chunk rule, optionally per packed group.
Tensor rank_piece(const Tensor& full, int64_t dim, int64_t groups = 1) {
  int64_t d = normalize_dim(dim, full.dim());
  int64_t g = full.size(d) / groups;
  std::vector<Tensor> parts;
  for (int64_t i = 0; i < groups; ++i) {
    ChunkSpan span = chunk_span(g, dist::world_size(), dist::world_rank());
    parts.push_back(full.narrow(d, i * g + span.offset, span.size));
  }
  return (parts.size() == 1 ? parts[0] : cat(parts, d)).clone();
}

// Applies `style` to `module` through the real plan machinery, then loads each
// parameter's slice from the full weights in `reference`.
void parallelize(nn::Module& module, nn::Module& reference, const std::string& style,
                 const parallel::StyleOverrides& overrides = {}) {
  std::vector<parallel::ParamRef> refs;
  for (nn::Parameter* p : module.own_parameters()) refs.push_back({p->name, module.name(), p->global_shape});
  parallel::ResolvedPlan plan = parallel::resolve_plan({{module.name(), style}}, {}, refs, {module.name()});
  parallel::apply_plan(module, plan, tp_rank(), &mesh(), overrides);
  auto ref_params = reference.own_parameters();
  auto params = module.own_parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    params[i]->data = take_shard(ref_params[i]->data, params[i]->shard);
    params[i]->data.set_requires_grad(true);
  }
}

void init_params(nn::Module& m, uint64_t seed) {
  for (nn::Parameter* p : m.own_parameters()) {
    p->data = Tensor::randn(p->global_shape, seed++);
    p->data.set_requires_grad(true);
  }
}

Tensor leaf(const Tensor& t) {
  Tensor c = t.clone();
  c.set_requires_grad(true);
  return c;
}

// sum(out * weights): a scalar loss with a distinct gradient per element.
Tensor weighted_loss(const Tensor& out, const Tensor& weights) { return ops::sum(ops::mul(out, weights)); }

struct LinearCase {
  std::string style;
  int64_t in = 8, out = 10;
  bool bias = true;
};

// Runs a Linear whole and with `style`; `x_layout`/`y_layout` say how the
// parallel input/output relate to the whole ones: -1 = this rank's chunk of the
// last dim (`groups` packed groups), 0 = replicated.
void check_linear(const LinearCase& c, int x_layout, int y_layout, int64_t groups = 1) {
  nn::Linear ref("layer", c.in, c.out, c.bias), par("layer", c.in, c.out, c.bias);
  init_params(ref, 11);
  parallelize(par, ref, c.style);

  Tensor x_full = Tensor::randn({2, 3, c.in}, 5);
  Tensor x_ref = leaf(x_full);
  Tensor x_par = leaf(x_layout == -1 ? rank_piece(x_full, -1, groups) : x_full);
  Tensor y_ref = ref(x_ref), y_par = par(x_par);
  Tensor r = Tensor::randn(y_ref.shape(), 99);
  Tensor r_par = y_layout == -1 ? rank_piece(r, -1, groups) : r;
  autograd::backward(weighted_loss(y_ref, r));
  autograd::backward(weighted_loss(y_par, r_par));

  expect_close(y_par, y_layout == -1 ? rank_piece(y_ref, -1, groups) : y_ref, kTol, c.style + " output");
  expect_close(x_par.grad(), x_layout == -1 ? rank_piece(x_ref.grad(), -1, groups) : x_ref.grad(), kTol,
               c.style + " input grad");
  auto pr = ref.own_parameters(), pp = par.own_parameters();
  for (size_t i = 0; i < pr.size(); ++i)
    expect_close(pp[i]->data.grad(), take_shard(pr[i]->data.grad(), pp[i]->shard), kTol,
                 c.style + " grad of " + pp[i]->name);
}

}  // namespace

TEST(Styles, Colwise) { check_linear({"colwise"}, 0, -1); }

TEST(Styles, ColwiseWithReplicatedKvHeadsSumsTheReplicasGradients) {
  // tp > kv heads (the models' k/v_proj): each kv head's rows sit on `replicas`
  // consecutive ranks, and each rank's own query heads weigh its copy of the
  // output differently, so the slice's true gradient is the sum over those ranks.
  const int tp = dist::world_size(), rank = dist::world_rank();
  if (tp < 2) GTEST_SKIP() << "needs 2 or more ranks";
  const int64_t replicas = tp % 2 == 0 ? 2 : tp, heads = tp / replicas, head_dim = 3, in = 8;
  nn::Linear ref("k_proj", in, heads * head_dim, true), par("k_proj", in, heads * head_dim, true);
  init_params(ref, 21);
  // The module keeps a pointer to its style: the override lives as long as the test.
  const parallel::StyleOverrides kv_style{
      {"k_proj", std::make_shared<parallel::ColwiseParallel>(parallel::ColwiseParallel::Options{.kv_replicas = replicas})}};
  parallelize(par, ref, "colwise", kv_style);
  Tensor x = Tensor::randn({2, 3, in}, 5), x_ref = leaf(x), x_par = leaf(x);
  // Rank r's downstream weights for its copy of head r / replicas; the reference
  // sums every rank's term over the whole output.
  auto weights_of = [&](int r) { return Tensor::randn({2, 3, head_dim}, 100 + r); };
  Tensor y_ref = ref(x_ref);
  Tensor loss_ref;
  for (int r = 0; r < tp; ++r) {
    Tensor term = weighted_loss(ops::narrow(y_ref, -1, (r / replicas) * head_dim, head_dim), weights_of(r));
    loss_ref = r == 0 ? term : ops::add(loss_ref, term);
  }
  autograd::backward(loss_ref);
  autograd::backward(weighted_loss(par(x_par), weights_of(rank)));
  expect_close(x_par.grad(), x_ref.grad(), kTol, "input grad");
  auto pr = ref.own_parameters(), pp = par.own_parameters();
  for (size_t i = 0; i < pr.size(); ++i)
    expect_close(pp[i]->data.grad(), take_shard(pr[i]->data.grad(), pp[i]->shard), kTol, "grad of " + pp[i]->name);
}

TEST(Styles, StylesUseTheMeshsTpDimWhereverItIs) {
  // "tp" second, after a data-parallel dim of size 1: a style that took the
  // mesh's first group would communicate over a group of one and be wrong.
  static const dist::DeviceMesh two_d({1, dist::world_size()}, {"dp", "tp"});
  current_mesh = &two_d;
  check_linear({"colwise"}, 0, -1);
  check_linear({"rowwise"}, -1, 0);
  check_linear({"colwise_gather_output", 8, 12}, 0, 0);
  current_mesh = nullptr;
}

TEST(Styles, ColwiseGatherOutput) {
  check_linear({"colwise_gather_output", 8, 12}, 0, 0);
  check_linear({"colwise_rep", 8, 12}, 0, 0);
}

TEST(Styles, ColwiseGatherOutputNeedsDivisibleOutput) {
  nn::Linear ref("lm_head", 8, 10, false), par("lm_head", 8, 10, false);
  init_params(ref, 1);
  if (10 % dist::world_size() == 0) {
    EXPECT_NO_THROW(parallelize(par, ref, "colwise_gather_output"));
    return;
  }
  try {
    parallelize(par, ref, "colwise_gather_output");
    ADD_FAILURE() << "expected an error for 10 outputs over " << dist::world_size() << " ranks";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("lm_head"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(10)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(" + std::to_string(dist::world_size()) + ")"), std::string::npos) << msg;
  }
}

TEST(Styles, Rowwise) { check_linear({"rowwise"}, -1, 0); }

TEST(Styles, RowwiseSplitInput) {
  check_linear({"rowwise_split_input"}, 0, 0);
  check_linear({"rowwise_rep"}, 0, 0);
}

TEST(Styles, PackedColwise) { check_linear({"packed_colwise", 8, 12}, 0, -1, 2); }

TEST(Styles, PackedRowwise) { check_linear({"packed_rowwise", 12, 6}, -1, 0, 2); }

TEST(Styles, AllReduce) {
  // A partial input (each rank holds x / N, no bias): the all-reduced output is W x.
  nn::Linear ref("layer", 8, 6, false), par("layer", 8, 6, false);
  init_params(ref, 3);
  parallelize(par, ref, "all_reduce");
  Tensor x_full = Tensor::randn({4, 8}, 6);
  Tensor x_ref = leaf(x_full), x_par = leaf(ops::scale(x_full, 1.0 / dist::world_size()));
  Tensor y_ref = ref(x_ref), y_par = par(x_par);
  Tensor r = Tensor::randn(y_ref.shape(), 7);
  autograd::backward(weighted_loss(y_ref, r));
  autograd::backward(weighted_loss(y_par, r));
  expect_close(y_par, y_ref, kTol, "all_reduce output");
  expect_close(x_par.grad(), x_ref.grad(), kTol, "all_reduce input grad");
}

namespace {

void check_embedding(const std::string& style, int64_t shard_dim) {
  nn::Embedding ref("embed_tokens", 10, 12), par("embed_tokens", 10, 12);
  init_params(ref, 21);
  parallelize(par, ref, style);
  Tensor ids = Tensor::from_ints({0, 9, 3, 7, 7, 2, 5, 1, 8, 4}, {2, 5});
  Tensor y_ref = ref(ids), y_par = par(ids);
  Tensor r = Tensor::randn(y_ref.shape(), 4);
  autograd::backward(weighted_loss(y_ref, r));
  autograd::backward(weighted_loss(y_par, r));
  expect_close(y_par, y_ref, kTol, style + " output");
  Tensor want = rank_piece(ref.weight.data.grad(), shard_dim);
  expect_close(par.weight.data.grad(), want, kTol, style + " weight grad");
}

}  // namespace

// 10 vocab rows over 3 or 4 ranks is uneven (4,4,2 / 3,3,3,1): ids outside a rank's rows look up zeros.
TEST(Styles, EmbeddingRowwise) { check_embedding("embedding_rowwise", 0); }
TEST(Styles, EmbeddingColwise) { check_embedding("embedding_colwise", 1); }

TEST(Styles, SequenceParallelNorm) {
  nn::RMSNorm ref("norm", 8, 1e-6), par("norm", 8, 1e-6);
  init_params(ref, 31);
  parallelize(par, ref, "sequence_parallel");
  Tensor x_full = Tensor::randn({2, 7, 8}, 8);  // 7 tokens: uneven over 2..4 ranks
  Tensor x_ref = leaf(x_full), x_par = leaf(x_full);
  Tensor y_ref = ref(x_ref), y_par = par(x_par);
  Tensor r = Tensor::randn(y_ref.shape(), 9);
  autograd::backward(weighted_loss(y_ref, r));
  autograd::backward(weighted_loss(y_par, rank_piece(r, 1)));
  expect_close(y_par, rank_piece(y_ref, 1), kTol, "sequence_parallel output (this rank's tokens)");
  expect_close(x_par.grad(), x_ref.grad(), kTol, "sequence_parallel input grad (all-gathered)");
  expect_close(par.weight.data.grad(), ref.weight.data.grad(), kTol, "sequence_parallel weight grad (all-reduced)");
}

TEST(Styles, ReplicatedWithGradAllreduce) {
  // Like Qwen3's q_norm: one weight applied to this rank's heads only.
  nn::RMSNorm ref("q_norm", 4, 1e-6), par("q_norm", 4, 1e-6);
  init_params(ref, 41);
  parallelize(par, ref, "replicated_with_grad_allreduce");
  Tensor x_full = Tensor::randn({2, 3, 8, 4}, 10);  // [B, T, heads, D]
  Tensor x_ref = leaf(x_full), x_par = leaf(rank_piece(x_full, 2));
  Tensor y_ref = ref(x_ref), y_par = par(x_par);
  Tensor r = Tensor::randn(y_ref.shape(), 11);
  autograd::backward(weighted_loss(y_ref, r));
  autograd::backward(weighted_loss(y_par, rank_piece(r, 2)));
  expect_close(y_par, rank_piece(y_ref, 2), kTol, "output");
  expect_close(x_par.grad(), rank_piece(x_ref.grad(), 2), kTol, "input grad");
  expect_close(par.weight.data.grad(), ref.weight.data.grad(), kTol, "weight grad (all-reduced over ranks)");
}

namespace {

// GPT-OSS-style attention core: per-head sinks [heads] of its own, a sliding window.
class SinkAttention : public nn::Module {
 public:
  SinkAttention(const std::string& name, int64_t heads) : nn::Module(name), sinks(add_parameter("sinks", {heads})) {}
  nn::Parameter& sinks;

 protected:
  Tensor forward(const std::vector<Tensor>& in) override {  // q, k, v [B, T, heads, D], this rank's heads
    return ops::attention(in[0], in[1], in[2], {.sliding_window = 3, .sinks = sinks.data});
  }
};

}  // namespace

TEST(Styles, LocalParamsWithColwiseSinksRunsThisRanksHeads) {
  // The sinks follow their own plan entry (colwise: Shard(0) of a 1-D parameter,
  // whole heads per rank); the module runs on local tensors, no communication.
  SinkAttention ref("attn", 12), par("attn", 12);
  init_params(ref, 61);
  std::vector<parallel::ParamRef> refs{{"attn.sinks", "attn", {12}}};
  parallel::ResolvedPlan plan =
      parallel::resolve_plan({{"attn", "local_params"}, {"attn.sinks", "colwise"}}, {}, refs, {"attn"});
  EXPECT_EQ(plan.param_style.at("attn.sinks"), "colwise");
  parallel::apply_plan(par, plan, tp_rank(), &mesh(), {});
  par.sinks.data = take_shard(ref.sinks.data, par.sinks.shard);
  par.sinks.data.set_requires_grad(true);
  EXPECT_EQ(par.sinks.data.size(0), 12 / dist::world_size());
  Tensor q = Tensor::randn({2, 6, 12, 4}, 62), k = Tensor::randn({2, 6, 12, 4}, 63), v = Tensor::randn({2, 6, 12, 4}, 64);
  Tensor y_ref = ref.call({q, k, v});
  Tensor y_par = par.call({rank_piece(q, 2), rank_piece(k, 2), rank_piece(v, 2)});
  Tensor r = Tensor::randn(y_ref.shape(), 65);
  autograd::backward(weighted_loss(y_ref, r));
  autograd::backward(weighted_loss(y_par, rank_piece(r, 2)));
  expect_close(y_par, rank_piece(y_ref, 2), kTol, "output");
  expect_close(par.sinks.data.grad(), rank_piece(ref.sinks.data.grad(), 0), kTol, "sinks grad");
}

TEST(Styles, LocalParamsRunsOnLocalTensors) {
  nn::Linear ref("layer", 6, 4, true), par("layer", 6, 4, true);
  init_params(ref, 51);
  parallelize(par, ref, "local_params");
  Tensor x = Tensor::randn({3, 6}, 12);
  expect_close(par(x), ref(x), kTol, "local_params output");
}

namespace {

// gate_up_proj [2I, H] fused, then silu(gate) * up, then down_proj (rowwise).
Tensor fused_mlp(nn::Linear& gate_up, nn::Linear& down, const Tensor& x) {
  Tensor gu = gate_up(x);
  int64_t half = gu.size(-1) / 2;
  return down(ops::swiglu(ops::narrow(gu, -1, 0, half), ops::narrow(gu, -1, half, half)));
}

double fused_mlp_error(const std::string& gate_up_style) {
  nn::Linear gu_ref("mlp.gate_up_proj", 8, 24, false), down_ref("mlp.down_proj", 12, 8, false);
  nn::Linear gu_par("mlp.gate_up_proj", 8, 24, false), down_par("mlp.down_proj", 12, 8, false);
  init_params(gu_ref, 61);
  init_params(down_ref, 71);
  parallelize(gu_par, gu_ref, gate_up_style);
  parallelize(down_par, down_ref, "rowwise");
  Tensor x = Tensor::randn({2, 5, 8}, 13);
  return max_abs_diff(fused_mlp(gu_par, down_par, x), fused_mlp(gu_ref, down_ref, x));
}

}  // namespace

TEST(Styles, PackedColwiseOnFusedGateUpMatchesSeparateWeights) {
  EXPECT_LT(fused_mlp_error("packed_colwise"), 1e-5);
  // Plain colwise hands rank 0 the first rows of [gate; up] (all gate), so the
  // halves no longer pair up: wrong as soon as there is more than one rank.
  if (dist::world_size() > 1) {
    EXPECT_GT(fused_mlp_error("colwise"), 1e-3);
  }
}

TEST(Styles, RegistryListsEveryShippedStyleAndTakesUserStyles) {
  for (const char* name : {"colwise", "colwise_gather_output", "colwise_rep", "rowwise", "rowwise_split_input",
                           "rowwise_rep", "embedding_rowwise", "embedding_colwise", "packed_colwise",
                           "packed_rowwise", "sequence_parallel", "sequence_parallel_gather_output",
                           "gather_sequence_input", "scatter_sequence_output", "replicated_with_grad_allreduce",
                           "all_reduce", "local_params"})
    EXPECT_NE(parallel::find_style(name), nullptr) << name;
  parallel::register_style("colwise_custom", std::make_shared<parallel::ColwiseParallel>());
  check_linear({"colwise_custom"}, 0, -1);
}
