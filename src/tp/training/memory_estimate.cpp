#include "tp/training/memory_estimate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <vector>
#include <ostream>

#include "tp/models/plan_report.h"
#include "tp/tensor/storage.h"
#include "tp/training/fsdp.h"

namespace tp::training {

namespace {

// The layer shapes on one rank: T tokens of the micro-batch, T_seq of them on a
// sequence shard (sequence parallelism), local q / kv widths and intermediate size.
struct LayerShapes {
  double T = 0, T_seq = 0, H = 0, Hq = 0, Hkv = 0, I = 0;
  bool qk_norm = false;
  bool tp = false;  // row-parallel outputs go through an all-reduce (or reduce-scatter)
  double s = 4;     // bytes a projection saves of its input per element (bf16 copy or f32)
};

// What a decoder layer saves for its backward without checkpointing.
double saved_without_checkpointing(const LayerShapes& l, bool sequence_parallel) {
  // The residual stream at both norms (sequence shards under SP).
  double bytes = 2 * 4 * l.T_seq * l.H;
  // q|k|v and gate|up each keep one copy of their (normed) input; under SP the
  // gathered input is gathered again in the backward and only the f32 shard is kept.
  bytes += sequence_parallel ? 2 * 4 * l.T_seq * l.H : 2 * l.s * l.T * l.H;
  bytes += 4 * l.T * (l.Hq + 2 * l.Hkv);            // attention's q, k (after rope) and v
  if (l.qk_norm) bytes += 4 * l.T * (l.Hq + l.Hkv);  // q_norm / k_norm inputs
  bytes += l.s * l.T * l.Hq;                         // o_proj's input
  bytes += 8 * l.T * l.I + l.s * l.T * l.I;          // SwiGLU's gate and up, down_proj's input
  return bytes;
}

// What a selectively checkpointed layer keeps: its input, the GEMMs' outputs
// (a row-parallel one's all-reduced sum instead of its partial sums) and attention's.
double kept_selective(const LayerShapes& l) {
  double bytes = 4 * l.T_seq * l.H;                 // the input
  bytes += 4 * l.T * (l.Hq + 2 * l.Hkv);            // q, k, v projections
  bytes += 4 * l.T * l.Hq;                          // attention
  bytes += 2 * 4 * (l.tp ? l.T_seq : l.T) * l.H;    // o_proj and down_proj (reduced)
  bytes += 8 * l.T * l.I;                           // gate and up
  return bytes;
}

// The backward's temporaries of one layer beyond what it saved: the incoming and
// outgoing gradients of the residual stream, SwiGLU's two input gradients, the
// bf16 copies of the output gradients.
double layer_workspace(const LayerShapes& l) {
  return 3 * 4 * l.T * l.H + 2 * 4 * l.T * l.I + 4 * l.T * l.I + 2 * l.T * std::max(l.I, l.H);
}

}  // namespace

std::string gib(int64_t bytes) { return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1 << 30)); }

MemoryEstimate estimate_training_memory(const MemoryEstimateInputs& in) {
  const ModelConfig& c = in.config;
  const std::string& type = c.model_type;
  TP_CHECK(type == "llama" || type == "mistral" || type == "qwen3" || type == "qwen2",
           "--estimate-memory covers dense decoders (llama, mistral, qwen3) so far, not model_type '{}' (its "
           "experts' and MLA's activations are not modelled yet)",
           type);
  TP_CHECK(in.seq_len >= 1 && in.batch_size >= 1, "--estimate-memory: seq_len {} and batch size {} must be >= 1",
           in.seq_len, in.batch_size);
  TP_CHECK(in.dp_shard_size >= 1, "--estimate-memory: dp_shard size {} must be >= 1", in.dp_shard_size);
  const int64_t tp = in.distributed.tp_size.value_or(1);
  const PlanReport plan = make_plan_report(c, in.distributed, DType::F32);
  double params = 0, matrices = 0;
  double layer_params = 0, layer_matrices = 0;  // of all the decoder layers
  int64_t vocab_local = c.vocab_size;
  for (const PlanParamRow& row : plan.parameters) {
    if (!row.tied_to.empty()) continue;
    const double n = static_cast<double>(numel(row.local_shapes.at(0)));
    const bool matrix = row.local_shapes.at(0).size() >= 2;
    params += n;
    if (matrix) matrices += n;
    if (row.name.rfind("model.layers.", 0) == 0) {
      layer_params += n;
      if (matrix) layer_matrices += n;
    }
    if (row.name == "lm_head.weight" || (row.name == "model.embed_tokens.weight" && c.tie_word_embeddings))
      vocab_local = row.local_shapes.at(0).at(0);
  }
  const double d = static_cast<double>(in.dp_shard_size);
  MemoryEstimate e;
  e.layers = c.num_hidden_layers;
  // Under bf16 with dp_shard, the matrices' masters are sharded; vectors stay whole.
  const double master_elements = in.bf16 && in.dp_shard_size > 1 ? matrices / d + (params - matrices) : params;
  const double compute_element = in.bf16_native ? 2 : 4;
  double compute_copy = in.bf16 ? matrices * compute_element : 0;
  if (in.bf16 && in.compute_copy_by_layer && in.dp_shard_size == 1) {
    // One unit's at a time (the Trainer's units with d = 1): the root's matrices
    // (held through lm_head, the loss and their backward) or a layer's, the larger.
    const double L = static_cast<double>(std::max<int64_t>(c.num_hidden_layers, 1));
    compute_copy = std::max(matrices - layer_matrices, layer_matrices / L) * compute_element;
  }
  e.weights = static_cast<int64_t>(4 * master_elements + compute_copy);
  e.gradients = static_cast<int64_t>(4 * params);
  if (in.fsdp) {
    // Masters and gradients in chunks of 1 / dp_shard; gathered, one unit at a time
    // (training/fsdp.h): the root's vectors and a block of its matrices' rows
    // (f32, and its compute copy), or a decoder layer's weights, the larger; or,
    // kept from the forward to the backward (shard_grad_op), every layer's too.
    // A whole gradient: a layer's, or the root's vectors and one block of rows.
    const double L = static_cast<double>(std::max<int64_t>(c.num_hidden_layers, 1));
    const double root = params - layer_params, root_matrices = matrices - layer_matrices;
    auto compute_bytes = [&](double all, double mats) {
      return (all - mats) * 4 + mats * (in.bf16 && in.bf16_native ? 2 : 4);
    };
    const double layer_compute = compute_bytes(layer_params / L, layer_matrices / L);
    // A block of rows of the vocabulary (FullyShardedDataParallel's buffers).
    const double H = static_cast<double>(c.hidden_size);
    const double block_rows = std::min(std::max(1.0, std::floor(kRowBlockBytes / (4 * H))),
                                       static_cast<double>(vocab_local));
    const double block = root_matrices > 0 ? 4 * H * block_rows : 0;
    const double root_rows = block * (in.bf16 && in.bf16_native ? 1.5 : 1);
    const double root_compute = compute_bytes(root - root_matrices, 0) + root_rows;
    const double gathered = in.fsdp_reshard_after_forward ? std::max(root_compute, layer_compute)
                                                          : root_compute + layer_compute * L;
    e.weights = static_cast<int64_t>(4 * params / d + gathered);
    const double root_grad = 4 * (root - root_matrices) + block;
    e.gradients = static_cast<int64_t>(4 * params / d + std::max(root_grad, 4 * layer_params / L));
  }
  const bool sgd = in.optim == "sgd";
  e.optimizer = static_cast<int64_t>((sgd ? (in.sgd_momentum > 0 ? 4 : 0) : 8) * params / d);

  LayerShapes l;
  l.T = static_cast<double>(in.seq_len * in.batch_size);
  const bool sp = plan.sequence_parallel;
  l.T_seq = sp ? std::ceil(l.T / static_cast<double>(tp)) : l.T;
  l.H = static_cast<double>(c.hidden_size);
  l.Hq = static_cast<double>(c.num_attention_heads * c.head_dim) / static_cast<double>(tp);
  // At tp above the KV heads, each rank holds one head (replicated).
  l.Hkv = static_cast<double>(std::max<int64_t>(1, c.num_key_value_heads / tp) * c.head_dim);
  l.I = static_cast<double>(c.intermediate_size) / static_cast<double>(tp);
  l.qk_norm = type == "qwen3";
  l.tp = tp > 1;
  l.s = in.bf16 ? 2 : 4;

  const double off = saved_without_checkpointing(l, sp);
  const double full = 4 * l.T_seq * l.H;
  const double selective = kept_selective(l);
  const GradientCheckpointing& ck = in.checkpointing;
  const int64_t checkpointed = ck.enabled ? c.num_hidden_layers / ck.every_n_layers : 0;
  const double kept = ck.policy == autograd::CheckpointPolicy::Full ? full : selective;
  e.activations_per_layer = static_cast<int64_t>(ck.enabled ? kept : off);
  e.activations = static_cast<int64_t>(kept * static_cast<double>(checkpointed) +
                                       off * static_cast<double>(c.num_hidden_layers - checkpointed));
  // The recompute of one checkpointed layer holds its no-checkpointing activations again.
  e.recompute = static_cast<int64_t>(checkpointed > 0 ? off : 0);
  e.workspace = static_cast<int64_t>(layer_workspace(l));

  // The final norm's input, then the loss.
  const double v = static_cast<double>(vocab_local);
  double loss_saved, loss_backward;
  if (in.fused_loss) {
    const int64_t v_max = (c.vocab_size + tp - 1) / tp;
    const double chunk_rows = std::clamp<double>(std::floor(static_cast<double>(int64_t{64} << 20) / (4.0 * v_max)), 1, l.T);
    loss_saved = l.s * l.T * l.H;
    loss_backward = 4 * chunk_rows * v + (in.bf16 && in.bf16_native ? 2 * chunk_rows * v : 0) +
                    (in.bf16 && !in.bf16_native ? 4 * chunk_rows * l.H : 0) + 4 * l.T * l.H;
  } else {
    loss_saved = 4 * l.T * v;
    loss_backward = 4 * l.T * v + 4 * l.T * l.H;
  }
  e.loss = static_cast<int64_t>(4 * l.T_seq * l.H + loss_saved);
  e.loss_backward = static_cast<int64_t>(loss_backward);
  e.total = e.weights + e.gradients + e.optimizer + e.activations + e.loss + e.backward_peak();
  return e;
}

nlohmann::ordered_json MemoryEstimate::to_json() const {
  nlohmann::ordered_json j;
  j["weights_bytes"] = weights;
  j["gradients_bytes"] = gradients;
  j["optimizer_bytes"] = optimizer;
  j["activations_per_layer_bytes"] = activations_per_layer;
  j["activations_bytes"] = activations;
  j["loss_bytes"] = loss;
  j["loss_backward_bytes"] = loss_backward;
  j["recompute_bytes"] = recompute;
  j["workspace_bytes"] = workspace;
  j["total_bytes"] = total;
  j["layers"] = layers;
  return j;
}

void print_memory_estimate(std::ostream& out, const MemoryEstimate& e) {
  out << fmt::format(
      "predicted peak per rank: {} = weights {} + gradients {} + optimizer {} + activations {} ({} layers x {}) + "
      "loss {} + the backward's peak {} (the loss's backward {}, or a layer's recompute {} and temporaries {})\n",
      gib(e.total), gib(e.weights), gib(e.gradients), gib(e.optimizer), gib(e.activations), e.layers,
      gib(e.activations_per_layer), gib(e.loss), gib(e.backward_peak()), gib(e.loss_backward), gib(e.recompute),
      gib(e.workspace));
}

// Peak RSS against the predicted tensor peak in bench/training/run_memory_bench.py (2026-12-02, tp 2,
// bench/results/training_memory.json): RSS exceeded the prediction by 0.47 GiB (off, 512 tokens) up to 1.13
// GiB (off, 4096: the allocator's cached blocks), and by 1.0 GiB where loading set the peak (full, 512).
// 10% + 512 MiB is above every one of those points.
int64_t resident_bytes(const MemoryEstimate& e) { return e.total + e.total / 10 + (int64_t{512} << 20); }

namespace {

int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return physical_memory_bytes();
}

}  // namespace

void check_memory_fits(const MemoryEstimateInputs& in, const MemoryEstimate& e, int64_t ranks_here) {
  if (const char* skip = std::getenv("TP_SKIP_MEMORY_CHECK"); skip != nullptr && std::string(skip) == "1") return;
  const int64_t available = available_memory_bytes();
  auto needed = [&](const MemoryEstimate& x, int64_t ranks) { return resident_bytes(x) * ranks; };
  if (needed(e, ranks_here) <= available) return;
  std::vector<std::string> options;
  // `ranks`: on this machine with the option (twice as many for a larger tp or dp_shard, unless on other machines).
  auto try_option = [&](const std::string& flags, MemoryEstimateInputs changed, int64_t ranks) {
    try {
      const MemoryEstimate x = estimate_training_memory(changed);
      options.push_back(fmt::format("{} ({} per rank{})", flags, gib(x.total),
                                    needed(x, ranks) <= available ? ", fits" : ", too much for this machine alone"));
    } catch (const Error&) {
    }
  };
  if (!in.checkpointing.enabled || in.checkpointing.policy != autograd::CheckpointPolicy::Full ||
      in.checkpointing.every_n_layers != 1) {
    MemoryEstimateInputs c = in;
    c.checkpointing = {true, autograd::CheckpointPolicy::Full, 1};
    try_option("--gradient-checkpointing", c, ranks_here);
  }
  const int64_t tp = in.distributed.tp_size.value_or(1);
  {
    MemoryEstimateInputs c = in;
    c.distributed.tp_size = tp * 2;
    try_option(fmt::format("--tp-size {} (on twice the ranks)", tp * 2), c, 2 * ranks_here);
  }
  {
    MemoryEstimateInputs c = in;
    c.dp_shard_size = in.dp_shard_size * 2;
    try_option(fmt::format("--dp-shard-size {} (on twice the ranks)", in.dp_shard_size * 2), c, 2 * ranks_here);
  }
  if (in.seq_len > 1) {
    MemoryEstimateInputs c = in;
    c.seq_len = in.seq_len / 2;
    try_option(fmt::format("--seq-len {}", in.seq_len / 2), c, ranks_here);
  }
  fail("this run needs about {} per rank, {} for the {} rank(s) on this machine, and {} is available: it would run "
       "out of memory. Options: {}. (TP_SKIP_MEMORY_CHECK=1 runs it anyway.)",
       gib(resident_bytes(e)), gib(needed(e, ranks_here)), ranks_here, gib(available), fmt::join(options, "; "));
}

}  // namespace tp::training
