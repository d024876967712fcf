// End-to-end training benchmark of one rank group: optimizer steps of causal-LM
// training (batch B x seq T random tokens, AdamW, clipping, vocab-parallel loss)
// through Trainer::training_step, medians over the timed steps. In the same
// process, rank 0 measures the matmul rates the targets are stated against: bf16
// and f32 GEMMs (M=512, K=1024, N=3072 through ops::linear, plain weights as
// training uses them). Rank 0 prints one JSON line; run_training_bench.py pairs
// tp = 1 and tp = 2 runs of it with PyTorch's.
//
//   mpirun -np N bench_training --model DIR [--seq-len 512] [--batch 1] [--steps 3] [--dtype bf16|f32]
//                               [--lora-r R] [--tp-size T --dp-replicate-size R --dp-shard-size S]
//                               [--sequence-parallel] [--gradient-checkpointing off|full|selective]
//                               [--every-n-layers N] [--whole-compute-copy]
//
// --batch is per data-parallel rank (tp ranks of one replica share it); tokens/s
// counts the global batch. The layout flags are ParallelismConfig's (default: all
// ranks tensor-parallel). The report gives each step's time inside the tp group's
// collectives and the data-parallel communication the step waited for.
//
// --lora-r: train a LoRA adapter of rank R (alpha 2R) on every attention and MLP
// projection instead of the whole model (frozen base); the report adds the
// trainable parameters and the optimizer-state and gradient bytes of each rank.
//
// Memory of a step, per rank, from the process: the high-water mark of the tensor
// bytes live during each timed step over those live when it began (activations
// and the backward's temporaries: what sequence parallelism and checkpointing
// shrink), the whole high-water mark of a step (everything the allocator holds for
// tensors), what --estimate-memory predicted for it, and the resident set before
// the first step and at its peak: over the whole run, over loading (up to the
// first step) and over the steps (warm-up included).
//
// FLOPs per step: 6 x (every Linear weight's elements, this rank's) x tokens, plus
// attention's two matmuls over the causal triangle, 3x for forward and backward.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <sys/resource.h>

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>

#include "bench_util.h"
#include "tp/distributed/parallelism_config.h"
#include "tp/distributed/process_group.h"
#include "tp/models/auto.h"
#include "tp/nn/layers.h"
#include "tp/ops/linear.h"
#include "tp/training/fsdp.h"
#include "tp/training/lora_training.h"
#include "tp/training/memory_estimate.h"
#include "tp/training/trainer.h"

using namespace tp;
using bench::Clock;
using bench::median;
using bench::peak_rss;
using bench::seconds;

namespace {

// Plain (unpacked) weight, as the training forward and backward use them.
double matmul_gflops(DType dtype) {
  Tensor x = Tensor::randn({512, 1024}, 1);
  Tensor w = Tensor::randn({3072, 1024}, 2, 0, 0.02f, dtype);
  std::vector<double> t;
  for (int r = 0; r < 8; ++r) {
    auto t0 = Clock::now();
    Tensor y = ops::linear(x, w);
    t.push_back(seconds(t0));
  }
  return 2.0 * 512 * 1024 * 3072 / median(t) / 1e9;
}

// Page faults cost ~10 us per 4 KiB page here: a steady-state step should take none.
int64_t minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_minflt);
}

}  // namespace

int main(int argc, char** argv) {
  dist::init(&argc, &argv);
  CLI::App app{"tp training benchmark"};
  std::string model_dir, dtype = "bf16";
  int64_t seq_len = 512, batch = 1, steps = 3, warmup = 1;
  bool skip_ceilings = false;
  int64_t lora_r = 0;
  bool sequence_parallel = false;
  std::string checkpointing = "off";
  int64_t every_n_layers = 1;
  bool whole_compute_copy = false;
  app.add_option("--model", model_dir)->required();
  app.add_option("--seq-len", seq_len);
  app.add_option("--batch", batch);
  app.add_option("--steps", steps);
  app.add_option("--warmup", warmup);
  app.add_option("--dtype", dtype, "compute: bf16 (f32 master weights) or f32");
  app.add_flag("--skip-ceilings", skip_ceilings);
  app.add_option("--lora-r", lora_r, "train a LoRA adapter of this rank on every projection (0: the whole model)");
  dist::ParallelismConfig parallelism;
  app.add_option("--tp-size", parallelism.tp_size);
  app.add_option("--dp-replicate-size", parallelism.dp_replicate_size);
  app.add_option("--dp-shard-size", parallelism.dp_shard_size);
  app.add_flag("--sequence-parallel", sequence_parallel, "DistributedConfig::enable_sequence_parallel");
  app.add_option("--gradient-checkpointing", checkpointing, "off, full or selective")
      ->check(CLI::IsMember({"off", "full", "selective"}));
  app.add_option("--every-n-layers", every_n_layers, "checkpoint layer i when i + 1 is a multiple of N");
  std::string fsdp;
  app.add_flag("--whole-compute-copy", whole_compute_copy,
               "under bf16: a whole bf16 copy of the model (TrainerOptions::compute_copy_by_layer = false)");
  app.add_option("--fsdp", fsdp, "TrainingArguments.fsdp over --dp-shard-size: full_shard or shard_grad_op");
  CLI11_PARSE(app, argc, argv);

  auto t_load = Clock::now();
  LoadOptions load = LoadOptions::for_training();
  load.verbose = false;
  load.distributed_config.enable_sequence_parallel = sequence_parallel;
  load.mesh = parallelism.build_device_mesh();
  PretrainedModel model = AutoModelForCausalLM::from_pretrained(model_dir, load);
  const double load_s = seconds(t_load);
  dist::ProcessGroup& group = model.mesh().group("tp");
  dist::ProcessGroup& job = model.mesh().root_group();
  const int64_t V = model.config().vocab_size;
  const int64_t dp = model.mesh().size("dp"), dp_rank = model.mesh().coordinate("dp");

  std::vector<int32_t> tokens(static_cast<size_t>((warmup + steps) * batch * dp * seq_len));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7919 + 13) % V);
  auto data = std::make_shared<training::TokenBlocks>(training::TokenBlocks::from_tokens(tokens, seq_len));
  training::TrainingArguments args;
  args.output_dir = (std::filesystem::temp_directory_path() / "tp-bench-training").string();
  args.per_device_train_batch_size = batch;
  args.max_steps = warmup + steps;
  args.save_strategy = "no";
  args.bf16 = dtype == "bf16";
  args.gradient_checkpointing = checkpointing != "off";
  args.fsdp = fsdp;
  if (args.gradient_checkpointing)
    args.gradient_checkpointing_kwargs = {{"policy", checkpointing}, {"every_n_layers", every_n_layers}};
  std::optional<training::LoraModel> lora;
  training::TrainerOptions options;
  if (lora_r > 0) {
    training::LoraConfig config;
    config.r = lora_r;
    config.lora_alpha = 2.0 * static_cast<double>(lora_r);
    config.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    lora = training::apply_lora(model, config, training::peft_init(42));
    options = training::adapter_training(model, *lora);
  }
  options.compute_copy_by_layer = !whole_compute_copy;
  training::Trainer trainer(model, args, data, nullptr, options);

  std::vector<double> step_s;
  std::vector<double> losses;
  std::vector<int64_t> faults, fresh_mb;
  std::vector<double> fb_s, norm_s, opt_s, tp_comm_s, dp_comm_s;
  int64_t step_peak_tensor_bytes = 0, peak_tensor_bytes = 0, live_between_steps = 0;
  const int64_t rss_before_steps = bench::current_rss();
  // Loading's peak (the checkpoint read, the slabs filled, the optimizer's state
  // taken) apart from the steps': the high-water mark is reset between them.
  const int64_t load_peak_rss = bench::peak_rss_since_reset();
  const bool rss_reset = bench::reset_peak_rss();
  for (int64_t s = 0; s < warmup + steps; ++s) {
    std::vector<int64_t> blocks;  // this replica's slice of the global batch
    for (int64_t b = 0; b < batch; ++b) blocks.push_back(((s * dp + dp_rank) * batch + b) % data->size());
    Tensor ids = data->batch(blocks);
    job.barrier();
    const int64_t f0 = minor_faults();
    const size_t a0 = allocator_stats().system_allocated_bytes;
    const double c0 = group.collective_seconds();
    reset_peak_tensor_bytes();
    const size_t live0 = allocator_stats().tensor_bytes;
    live_between_steps = static_cast<int64_t>(live0);
    auto t0 = Clock::now();
    training::StepResult r = trainer.training_step({{ids, ids}});
    const double tp_comm = group.collective_seconds() - c0;
    job.barrier();  // a step ends when its slowest rank does
    if (s >= warmup) {
      step_peak_tensor_bytes =
          std::max(step_peak_tensor_bytes, static_cast<int64_t>(allocator_stats().peak_tensor_bytes - live0));
      peak_tensor_bytes = std::max(peak_tensor_bytes, static_cast<int64_t>(allocator_stats().peak_tensor_bytes));
      step_s.push_back(seconds(t0));
      tp_comm_s.push_back(tp_comm);
      dp_comm_s.push_back(r.data_parallel_s);
      faults.push_back(minor_faults() - f0);
      fb_s.push_back(r.forward_backward_s);
      norm_s.push_back(r.grad_norm_s);
      opt_s.push_back(r.optimizer_s);
      fresh_mb.push_back(static_cast<int64_t>((allocator_stats().system_allocated_bytes - a0) >> 20));
    }
    losses.push_back(r.loss);
  }

  const ModelConfig& c = model.config();
  double linear_params = 0;
  for (nn::Module* m : model.lm().modules())
    if (auto* linear = dynamic_cast<nn::Linear*>(m)) linear_params += static_cast<double>(numel(nn::local_shape(linear->weight)));
  int64_t trainable = 0;
  for (const training::TrainableParam& p : trainer.parameters().params()) trainable += numel(p.global_shape);
  const double tokens_per_step = static_cast<double>(batch * dp * seq_len);  // global
  const double attention_flops = 3.0 * 2.0 * 2.0 * static_cast<double>(seq_len * (seq_len + 1) / 2) *
                                 static_cast<double>(c.head_dim) *
                                 static_cast<double>(c.num_attention_heads / model.tp_size() * c.num_hidden_layers) *
                                 static_cast<double>(batch);
  // A frozen base computes no weight gradients: 4 x (forward + input gradient) instead of 6 x.
  // This rank's work: its replica's tokens.
  const double step_flops = (lora ? 4.0 : 6.0) * linear_params * static_cast<double>(batch * seq_len) + attention_flops;
  Tensor all_rss = job.all_gather(Tensor::from_ints({peak_rss()}, {1}), 0);
  Tensor all_load_rss = job.all_gather(Tensor::from_ints({load_peak_rss}, {1}), 0);
  Tensor all_step_rss = job.all_gather(Tensor::from_ints({rss_reset ? bench::peak_rss_since_reset() : -1}, {1}), 0);
  Tensor all_rss0 = job.all_gather(Tensor::from_ints({rss_before_steps}, {1}), 0);
  Tensor all_step_peak = job.all_gather(Tensor::from_ints({step_peak_tensor_bytes}, {1}), 0);
  Tensor all_peak = job.all_gather(Tensor::from_ints({peak_tensor_bytes}, {1}), 0);
  // The prediction for rank 0's step (tp train --estimate-memory), for full fine-tuning of dense models.
  nlohmann::ordered_json estimate = nullptr;
  try {
    training::MemoryEstimateInputs mem;
    mem.config = model.config();
    mem.distributed.tp_size = model.tp_size();
    mem.distributed.enable_sequence_parallel = sequence_parallel;
    mem.dp_shard_size = *parallelism.resolved(job.size()).dp_shard_size;
    mem.fsdp = args.fsdp_options().enabled;
    mem.fsdp_reshard_after_forward = args.fsdp_options().reshard_after_forward;
    mem.seq_len = seq_len;
    mem.batch_size = batch;
    mem.bf16 = args.bf16;
    mem.bf16_native = trainer.parameters().bf16_native();
    mem.compute_copy_by_layer = trainer.parameters().computes_by_unit();
    mem.checkpointing = args.checkpointing();
    mem.fused_loss = trainer.fused_loss();
    if (lora_r == 0) estimate = training::estimate_training_memory(mem).to_json();
  } catch (const Error& e) {
    estimate = e.what();
  }
  // What the optimizer holds on each rank (its moments; a dp_shard rank only its chunks').
  Tensor all_opt_job = job.all_gather(Tensor::from_ints({trainer.optimizer().state_bytes()}, {1}), 0);
  // Between steps: what the run keeps (masters, gradients, optimizer state; under
  // FSDP no unit is gathered then), and this rank's local parameters (its tp slice, padded).
  Tensor all_live = job.all_gather(Tensor::from_ints({live_between_steps}, {1}), 0);
  Tensor all_local = job.all_gather(Tensor::from_ints({trainer.parameters().numel()}, {1}), 0);
  double bf16_gflops = 0, f32_gflops = 0;
  if (!skip_ceilings && job.rank() == 0) {
    bf16_gflops = matmul_gflops(DType::BF16);
    f32_gflops = matmul_gflops(DType::F32);
  }
  if (job.rank() == 0) {
    const double t = median(step_s);
    const dist::ParallelismConfig sizes = parallelism.resolved(job.size());
    nlohmann::ordered_json j;
    j["tp_size"] = model.tp_size();
    j["dp_replicate_size"] = *sizes.dp_replicate_size;
    j["dp_shard_size"] = *sizes.dp_shard_size;
    j["threads_per_rank"] = omp_get_max_threads();
    j["compute"] = dtype;
    j["seq_len"] = seq_len;
    j["batch"] = batch;
    j["load_s"] = load_s;
    j["step_s"] = step_s;
    j["step_s_median"] = t;
    j["tokens_per_s"] = tokens_per_step / t;
    j["losses"] = losses;
    j["minor_page_faults_per_step"] = faults;
    j["fresh_tensor_memory_mb_per_step"] = fresh_mb;  // asked of the OS, not from the block cache
    j["loss_parallel"] = trainer.loss_parallel();
    // Rank 0's medians: forward + backward (with their collectives), the replicated-gradient sync and global norm, the optimizer.
    j["phase_s_median"] = {{"forward_backward", median(fb_s)}, {"grad_sync_norm", median(norm_s)},
                           {"optimizer", median(opt_s)}};
    // Communication per step (rank 0): inside the tp group's collectives (all in
    // the step's critical path), and data-parallel communication not hidden behind the backward.
    j["tp_collective_s_median"] = median(tp_comm_s);
    j["dp_exposed_communication_s_median"] = median(dp_comm_s);
    j["step_gflop_per_rank"] = step_flops / 1e9;
    j["matmul_gflops_per_rank"] = step_flops / t / 1e9;
    j["peak_rss_bytes_per_rank"] = all_rss.to_int_vector();
    // The two parts of that peak: up to the first step (loading), and over the steps (-1: not measurable here).
    j["load_peak_rss_bytes_per_rank"] = all_load_rss.to_int_vector();
    j["steps_peak_rss_bytes_per_rank"] = all_step_rss.to_int_vector();
    j["sequence_parallel"] = model.sequence_parallel();
    j["rss_before_steps_bytes_per_rank"] = all_rss0.to_int_vector();
    j["step_peak_tensor_bytes_per_rank"] = all_step_peak.to_int_vector();
    j["peak_tensor_bytes_per_rank"] = all_peak.to_int_vector();
    j["gradient_checkpointing"] = checkpointing;
    j["every_n_layers"] = every_n_layers;
    j["fused_loss"] = trainer.fused_loss();
    j["memory_estimate"] = estimate;
    j["lora_r"] = lora_r;
    j["trainable_parameters"] = trainable;
    j["optimizer_state_bytes_per_rank"] = all_opt_job.to_int_vector();
    j["fsdp"] = fsdp;
    j["compute_copy_by_layer"] = trainer.parameters().computes_by_unit() && !trainer.parameters().fully_sharded();
    j["tensor_bytes_between_steps_per_rank"] = all_live.to_int_vector();
    // FSDP: the most bytes of whole units (gathered weights, whole gradients, the
    // root's gradient-block buffer) held at once on rank 0, on top of its chunks.
    j["fsdp_peak_gathered_bytes"] = trainer.fsdp() != nullptr ? trainer.fsdp()->peak_gathered_bytes() : 0;
    j["local_parameters_per_rank"] = all_local.to_int_vector();
    j["gradient_bytes_per_rank"] = trainer.parameters().numel() * 4;
    if (!skip_ceilings) {
      j["bf16_matmul_gflops_same_run"] = bf16_gflops;
      j["f32_matmul_gflops_same_run"] = f32_gflops;
    }
    std::cout << j.dump() << std::endl;
  }
  return 0;
}
