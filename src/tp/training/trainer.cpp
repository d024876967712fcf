#include "tp/training/trainer.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <utility>
#include <regex>
#include <set>
#include <tuple>
#include <sstream>

#include "tp/autograd/tape.h"
#include "tp/models/moe.h"
#include "tp/nn/layers.h"
#include "tp/training/checkpoint.h"
#include "tp/training/data_parallel.h"
#include "tp/training/fsdp.h"
#include "tp/training/optimizer_factory.h"
#include "tp/training/loss.h"
#include "tp/ops/denormals.h"
#include "tp/ops/elementwise.h"

namespace tp::training {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------- setup

namespace {

// Every rank of the group must hold the same value (data, arguments): a rank
// that read another file would silently train on other batches.
void check_same_on_all_ranks(uint64_t value, dist::ProcessGroup& group, const std::string& what) {
  std::vector<int64_t> all =
      group.all_gather(Tensor::from_ints({static_cast<int64_t>(value)}, {1}), 0).to_int_vector();
  for (size_t r = 1; r < all.size(); ++r)
    TP_CHECK(all[r] == all[0], "rank {} and rank 0 disagree on {}: every rank must be given the same", r, what);
}

// Rank 0 creates output_dir and proves it can write there; every rank learns the outcome.
void prepare_output_dir(const fs::path& dir, dist::ProcessGroup& group) {
  dist::on_rank0(group, "", [&] {
    std::error_code ec;
    fs::create_directories(dir, ec);
    const fs::path probe = dir / ".tp-write-test";
    std::ofstream out(probe);
    TP_CHECK(!ec && out, "output_dir {} is not writable{}", dir.string(), ec ? ": " + ec.message() : "");
    out.close();
    fs::remove(probe, ec);
    remove_partial_checkpoints(dir);
  });
}

bool finite(double x) { return std::isfinite(x); }

}  // namespace

Trainer::Trainer(PretrainedModel& model, TrainingArguments args, std::shared_ptr<const TokenBlocks> train,
                 std::shared_ptr<const TokenBlocks> eval, TrainerOptions options)
    : model_(model), args_(std::move(args)), train_(std::move(train)), eval_(std::move(eval)),
      options_(std::move(options)) {
  args_.validate();
  ops::flush_denormals_to_zero();  // the whole run computes without denormals
  TP_CHECK(train_ != nullptr && train_->size() > 0, "the Trainer needs training data (at least one block)");
  const ModelConfig& c = model_.config();
  for (const TokenBlocks* d : {train_.get(), eval_.get()}) {
    if (d == nullptr) continue;
    TP_CHECK(c.max_position_embeddings <= 0 || d->seq_len() <= c.max_position_embeddings,
             "seq_len {} is above the model's max_position_embeddings {} ({})", d->seq_len(),
             c.max_position_embeddings, model_.source_dir().string());
  }
  TP_CHECK(args_.eval_strategy == "no" || eval_ != nullptr, "eval_strategy 'steps' needs eval data");
  // Noise Transformers adds in training only (model.train()): refused by name rather than left out.
  // (resid_pdrop and embd_pdrop: Phi-3's dropout on each block's output and on the embeddings.)
  static const std::pair<const char*, const char*> kTrainingNoise[] = {{"attention_dropout", "attention dropout"},
                                                                       {"resid_pdrop", "residual dropout"},
                                                                       {"embd_pdrop", "embedding dropout"},
                                                                       {"router_jitter_noise", "router jitter noise"}};
  for (const auto& [key, what] : kTrainingNoise) {
    auto it = c.raw.find(key);
    TP_CHECK(it == c.raw.end() || it->is_null() || (it->is_number() && it->get<double>() == 0.0),
             "{}: '{}' is {}: tp's Trainer applies no {} (inference ignores it, as Transformers' eval mode does); "
             "set it to 0.0 to train", c.source, key, it == c.raw.end() ? "" : it->dump(), what);
  }
  schedule_ = parse_schedule(args_.lr_scheduler_type);
  const dist::DeviceMesh& mesh = model_.mesh();
  job_ = &mesh.root_group();
  if (mesh.has_dim("dp") && mesh.size("dp") > 1) {
    dp_ = &mesh.group("dp");
    dp_size_ = mesh.size("dp");
    dp_rank_ = mesh.coordinate("dp");
  }
  const int64_t B = args_.per_device_train_batch_size, K = args_.gradient_accumulation_steps;
  const int64_t batches = (train_->size() + B * dp_size_ - 1) / (B * dp_size_);
  steps_per_epoch_ = batches / K;
  TP_CHECK(steps_per_epoch_ >= 1,
           "{} holds {} blocks of {} tokens: fewer than one optimizer step needs ({} micro-batches of {} blocks on "
           "each of {} data-parallel rank(s)); add data, or lower the batch size, gradient accumulation or seq_len",
           train_->source(), train_->size(), train_->seq_len(), K, B, dp_size_);
  total_steps_ = args_.max_steps > 0
                     ? args_.max_steps
                     : static_cast<int64_t>(std::ceil(args_.num_train_epochs * static_cast<double>(steps_per_epoch_)));
  warmup_ = args_.warmup_steps >= 1 ? static_cast<int64_t>(args_.warmup_steps)
                                    : static_cast<int64_t>(std::ceil(args_.warmup_steps * total_steps_));

  // Every rank reads all the data and takes its slice: they must hold the same.
  check_same_on_all_ranks(train_->fingerprint(), *job_, "the training data");
  if (eval_) check_same_on_all_ranks(eval_->fingerprint(), *job_, "the eval data");
  prepare_output_dir(args_.output_dir, *job_);

  loss_parallel_ = args_.loss_parallel && model_.can_shard_logits();
  model_.lm().set_gradient_checkpointing(args_.checkpointing());
  ExpertParallelGroups ep;
  if (mesh.has_dim("ep")) {
    TP_CHECK(dp_ == nullptr, "expert parallelism (ep_size {}) with data parallelism (dp {}) is not supported; train "
             "with one of them", mesh.size("ep"), dp_size_);
    ep = {&mesh.group("ep"), &mesh.group("ep_replicas")};
  }
  const TrainingArguments::Fsdp fsdp = args_.fsdp_options();
  // A parameter's unit: its decoder layer, or the root.
  const auto layer_of = [](const std::string& name) -> int64_t {
    static const std::regex layer(R"((?:^|\.)layers\.(\d+)\.)");
    std::smatch m;
    return std::regex_search(name, m, layer) ? std::stoll(m[1].str()) : -1;
  };
  FullyShardOptions shard;
  if (fsdp.enabled) {
    TP_CHECK(mesh.has_dim("dp_shard") && mesh.size("dp_shard") > 1,
             "fsdp '{}' shards over the dp_shard dim, which this run does not have (size {}); give it 2 or more "
             "ranks (--dp-shard-size N, ParallelismConfig(dp_shard_size=N))", args_.fsdp,
             mesh.has_dim("dp_shard") ? mesh.size("dp_shard") : 1);
    shard = {&mesh.group("dp_shard"), layer_of};
  }
  // Under bf16 without FSDP: the compute copies by layer all the same (FSDP's units
  // with d = 1), not a whole bf16 copy of the model beside the masters. Not where
  // the optimizer's updates are sharded over dp_shard (their all-gather fills the
  // whole copy) or the experts over ep.
  const bool dp_sharded = mesh.has_dim("dp_shard") && mesh.size("dp_shard") > 1;
  if (!fsdp.enabled && args_.bf16 && options_.compute_copy_by_layer && !ep.enabled() && !dp_sharded)
    shard.unit_of = layer_of;
  params_ = std::make_unique<ModelParameters>(model_.lm(), mesh.group("tp"), args_.bf16, options_.trainable, ep,
                                              shard, options_.bf16_native_gemm);
  for (nn::Module* m : model_.lm().modules())
    if (auto* block = dynamic_cast<const SparseMoeBlock*>(m)) {
      const MoeConfig& moe = block->moe_config();
      if (moe.output_router_logits) router_aux_loss_coef_ = moe.router_aux_loss_coef;
      break;
    }
  TP_CHECK(!params_->params().empty(), "the Trainer has no parameter to train (TrainerOptions::trainable chose none)");
  if (fsdp.enabled) {
    // Soft-capped logits take the unfused loss, whose lm_head forward FSDP's root gather does not cover yet.
    TP_CHECK(model_.lm().final_logit_softcapping() == 0,
             "fsdp: a model whose logits are soft-capped after lm_head (final_logit_softcapping {}) does not train "
             "under FSDP yet (its unfused loss reads lm_head's weight outside FSDP's gather); use dp_replicate (DDP) "
             "with tp instead",
             model_.lm().final_logit_softcapping());
    fsdp_ = std::make_unique<FullyShardedDataParallel>(*params_, mesh.group("dp_replicate"),
                                                       fsdp.reshard_after_forward);
  } else if (params_->computes_by_unit()) {
    fsdp_ = std::make_unique<FullyShardedDataParallel>(*params_);
  }
  if (fsdp_) model_.lm().set_unit_hooks(fsdp_.get());
  // The loaded weights (now in the slabs) went back to the allocator's cache:
  // returned to the OS before the optimizer takes its state, they do not add to
  // loading's peak (the masters, the gradients and the state together).
  release_cached_memory();
  if (!fsdp.enabled && dp_ != nullptr) {
    const double mib = args_.ddp_bucket_cap_mb.value_or(25.0);
    reducer_ = std::make_unique<GradientReducer>(*params_, mesh.group("dp_replicate"), mesh.group("dp_shard"),
                                                 static_cast<int64_t>(mib * 1024 * 1024));
  }
  optimizer_ = make_optimizer(args_, *params_);  // sized for what this rank updates (after sharding)

  // Transformers' floating_point_ops: 6 flops per token per parameter, embeddings
  // (and an lm_head tied to them) left out.
  std::set<const TensorImpl*> embeddings;
  for (nn::Module* m : model_.lm().modules())
    if (auto* e = dynamic_cast<nn::Embedding*>(m)) embeddings.insert(e->weight.data.impl());
  for (nn::Parameter* p : model_.lm().parameters())
    if (!embeddings.count(p->data.impl())) flos_per_token_ += 6.0 * static_cast<double>(numel(p->global_shape));
  state_.max_steps = total_steps_;
  state_.num_train_epochs = std::ceil(static_cast<double>(total_steps_) / static_cast<double>(steps_per_epoch_));
  state_.logging_steps = args_.logging_steps;
  state_.eval_steps = args_.eval_steps.value_or(args_.logging_steps);
  state_.save_steps = args_.save_steps;
  state_.train_batch_size = B * dp_size_;
  // Loading's buffers (the checkpoint's tensors, converted copies) went back to the
  // allocator's cache when the slabs took the values: give them back to the OS, or
  // they stay resident through the run (1.2 GB per rank for Qwen3-0.6B at tp 2).
  release_cached_memory();
}

Trainer::~Trainer() {
  model_.lm().set_gradient_checkpointing({});
  if (fsdp_) {
    // And whole weights: every unit gathered for good (collective; not while an
    // error unwinds one rank alone).
    model_.lm().set_unit_hooks(nullptr);
    if (std::uncaught_exceptions() == 0)
      for (size_t u = 0; u < params_->units().size(); ++u)
        if (!params_->unit_gathered(u)) params_->gather_unit(u);
  }
}

MicroBatch Trainer::idle_micro_batch() const {
  Tensor ids = train_->batch({0});
  std::vector<int64_t> ignored(static_cast<size_t>(ids.numel()), -100);
  return {ids, Tensor::from_ints(ignored, ids.shape())};
}

double Trainer::lr_at(int64_t step) const {
  return args_.learning_rate * lr_factor(schedule_, step, warmup_, total_steps_);
}

// ---------------------------------------------------------------- steps

std::vector<MicroBatch> Trainer::micro_batches_for(int64_t step) const {
  const int64_t epoch = step / steps_per_epoch_, within = step % steps_per_epoch_;
  const int64_t B = args_.per_device_train_batch_size, K = args_.gradient_accumulation_steps;
  const std::vector<int64_t> order =
      epoch_order(train_->size(), static_cast<uint64_t>(args_.data_seed.value_or(args_.seed)), epoch);
  std::vector<MicroBatch> out;
  for (int64_t k = 0; k < K; ++k) {
    // This dp rank's slice of the global micro-batch of B x dp blocks (the last one of an epoch may be short).
    const int64_t global = (within * K + k) * B * dp_size_;
    const int64_t first = std::min<int64_t>(global + dp_rank_ * B, train_->size());
    const int64_t last = std::min<int64_t>(first + B, std::min<int64_t>(global + (dp_rank_ + 1) * B, train_->size()));
    if (first == last) {
      out.push_back({});  // nothing for this replica: it still takes part in the gradient reduction
      continue;
    }
    std::vector<int64_t> blocks(order.begin() + first, order.begin() + last);
    Tensor ids = train_->batch(blocks);
    out.push_back({ids, ids});
  }
  return out;
}

bool Trainer::fused_loss() const {
  // The fused loss runs lm_head's GEMM itself: logits soft-capped after it take the plain path.
  nn::Linear& head = model_.lm().output_embeddings();
  return (model_.tp_size() == 1 || loss_parallel_) && head.adapter() == nullptr && head.bias == nullptr &&
         head.weight.data.defined() && model_.lm().final_logit_softcapping() == 0;
}

Trainer::MicroBatchLoss Trainer::loss_of(const Tensor& ids, const Tensor& labels, double normalizer,
                                         const VocabSlice& vocab) {
  CausalLM& lm = model_.lm();
  const bool router_logits = router_aux_loss_coef_.has_value();
  if (!fused_loss()) {
    CausalLMOutput out = lm.forward_ids(ids, {.sharded_logits = loss_parallel_, .output_router_logits = router_logits});
    return {causal_lm_loss(out.logits, labels, normalizer, vocab), out.aux_loss};
  }
  // lm_head's input as its style hands it to the GEMM (replicated, dX all-reduced in the backward).
  nn::Linear& head = lm.output_embeddings();
  HiddenOutput decoded = lm.forward_hidden(ids, {.output_router_logits = router_logits});
  Tensor h = decoded.hidden;
  if (const nn::TensorParallelLayer* style = lm.head_style(loss_parallel_))
    h = style->transform_inputs_pre_forward(head, {h}, *head.mesh()).at(0);
  return {causal_lm_loss_from_hidden(h, head.weight.data, head.compute_dtype, labels, normalizer, vocab),
          decoded.aux_loss};
}

StepResult Trainer::training_step(const std::vector<MicroBatch>& micro_batches) {
  TP_CHECK(!micro_batches.empty(), "training_step needs at least one micro-batch");
  autograd::clear_tape();  // nothing of an earlier failed step may take part
  StepResult r;
  int64_t tokens = 0;
  for (const MicroBatch& mb : micro_batches) {
    if (!mb.input_ids.defined()) continue;
    r.targets += count_targets(mb.labels);
    tokens += mb.input_ids.numel();
  }
  if (dp_ != nullptr) {  // the step's targets and tokens over every replica: the loss is normalized by all of them
    Tensor counts = Tensor::from_ints({r.targets, tokens}, {2});
    dp_->all_reduce(counts);
    const std::vector<int64_t> c = counts.to_int_vector();
    r.targets = c[0];
    tokens = c[1];
  }
  const int64_t step = state_.global_step;
  if (options_.on_step_begin)
    options_.on_step_begin(step, dp_rank_ * args_.per_device_train_batch_size * train_->seq_len());
  TP_CHECK(r.targets > 0, "step {}: its micro-batches have no target to predict (every label is -100)", step + 1);
  const VocabSlice vocab{model_.lm().logits_vocab_start(loss_parallel_), model_.config().vocab_size,
                         loss_parallel_ ? &model_.mesh().group("tp") : nullptr};
  auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  const auto t0 = Clock::now();
  params_->zero_grad();
  int64_t aux_batches = 0;
  for (size_t k = 0; k < micro_batches.size(); ++k) {
    const MicroBatch& mb = micro_batches[k];
    // The last backward reduces gradient buckets over dp as they complete (DDP's no_sync before it).
    std::unique_ptr<autograd::LeafGradReadyHook> watch;
    if (reducer_ && k + 1 == micro_batches.size()) watch = reducer_->watch_backward();
    if (params_->fully_sharded()) watch = fsdp_->watch_backward();
    const bool idle = !mb.input_ids.defined();
    if (idle && !params_->fully_sharded()) continue;
    const MicroBatch run = idle ? idle_micro_batch() : mb;  // its loss and gradients are zeros
    MicroBatchLoss micro = loss_of(run.input_ids, run.labels, static_cast<double>(r.targets), vocab);
    Tensor loss = micro.loss;
    if (router_aux_loss_coef_) {
      const Tensor& aux = micro.aux_loss;
      if (!idle) {
        r.aux_loss += aux.item();
        ++aux_batches;
      }
      loss = ops::add(loss, ops::scale(aux, idle ? 0.0 : *router_aux_loss_coef_));
    }
    r.loss += loss.item();
    autograd::backward(loss);
  }
  if (aux_batches > 0) r.aux_loss /= static_cast<double>(aux_batches);
  if (reducer_) reducer_->finish();
  if (fsdp_) fsdp_->finish();
  if (dp_ != nullptr) r.loss = sum_over_ranks(r.loss, *dp_);
  state_.num_input_tokens_seen += tokens;
  state_.total_flos += flos_per_token_ * static_cast<double>(tokens);
  // Nothing has touched the weights yet: a bad step leaves the model (and the last checkpoint) as they were.
  TP_CHECK(finite(r.loss), "step {}: the loss is {}; stopping before the update (lower the learning rate, or check "
           "the data)", step + 1, r.loss);
  r.forward_backward_s = since(t0);
  const auto t1 = Clock::now();
  params_->sync_ep_replicas();
  params_->sync_replicated_grads();
  r.grad_norm = params_->global_grad_norm();
  r.grad_norm_s = since(t1);
  TP_CHECK(finite(r.grad_norm), "step {}: the gradient norm is {} (loss {}); stopping before the update", step + 1,
           r.grad_norm, r.loss);
  // torch's clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1
  // (fused into the optimizer's pass over the gradients).
  float grad_scale = 1.f;
  if (args_.max_grad_norm > 0) {
    const double coef = args_.max_grad_norm / (r.grad_norm + 1e-6);
    if (coef < 1) grad_scale = static_cast<float>(coef);
  }
  r.learning_rate = lr_at(step);
  const auto t2 = Clock::now();
  optimizer_->step(r.learning_rate, grad_scale);
  if (reducer_) {
    reducer_->gather_updated_weights();
    r.data_parallel_s = reducer_->take_communication_seconds();
  }
  if (fsdp_) {
    fsdp_->gather_updated_weights();
    r.data_parallel_s = fsdp_->take_communication_seconds();
  }
  r.optimizer_s = since(t2);
  ++state_.global_step;
  state_.epoch = static_cast<double>(state_.global_step) / static_cast<double>(steps_per_epoch_);
  return r;
}

// ---------------------------------------------------------------- loop

void Trainer::log(json logs) {
  logs["epoch"] = state_.epoch;
  logs["step"] = state_.global_step;
  state_.log_history.push_back(logs);
  for (auto& cb : callbacks_) cb->on_log(args_, state_, logs);
}

void Trainer::maybe_log_save_evaluate(const StepResult& r, double step_seconds) {
  const int64_t step = state_.global_step;
  if (step % args_.logging_steps == 0 || (args_.logging_first_step && step == 1)) {
    // Transformers' keys: the mean loss since the last log, the last gradient
    // norm (before clipping), and the learning rate the scheduler now holds.
    json logs = {{"loss", window_loss_ / static_cast<double>(window_steps_)},
                 {"grad_norm", r.grad_norm},
                 {"learning_rate", lr_at(step)}};
    if (router_aux_loss_coef_) logs["aux_loss"] = window_aux_loss_ / static_cast<double>(window_steps_);
    log(logs);
    window_loss_ = 0;
    window_aux_loss_ = 0;
    window_steps_ = 0;
  }
  if (args_.eval_strategy == "steps" && eval_ && step % state_.eval_steps == 0) evaluate();
  if (args_.save_strategy == "steps" && step % args_.save_steps == 0) save_checkpoint();
}

TrainOutput Trainer::train(const std::string& resume_from_checkpoint) {
  if (!resume_from_checkpoint.empty()) {
    fs::path dir = resume_from_checkpoint;
    if (resume_from_checkpoint == "last") {
      auto last = latest_checkpoint(args_.output_dir);
      TP_CHECK(last.has_value(), "resume_from_checkpoint 'last': {} holds no checkpoint-<step> directory",
               args_.output_dir);
      dir = *last;
    }
    load_checkpoint(dir);
  }
  for (auto& cb : callbacks_) cb->on_train_begin(args_, state_);
  const auto start = Clock::now();
  const int64_t first_step = state_.global_step;
  while (state_.global_step < total_steps_) {
    const auto t0 = Clock::now();
    for (auto& cb : callbacks_) cb->on_step_begin(args_, state_);
    StepResult r = training_step(micro_batches_for(state_.global_step));
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    window_loss_ += r.loss;
    window_aux_loss_ += r.aux_loss;
    ++window_steps_;
    run_loss_ += r.loss;
    ++run_steps_;
    for (auto& cb : callbacks_) cb->on_step_end(args_, state_);
    maybe_log_save_evaluate(r, seconds);
  }
  const double runtime = std::chrono::duration<double>(Clock::now() - start).count();
  const int64_t steps = state_.global_step - first_step;
  TrainOutput out;
  out.global_step = state_.global_step;
  out.training_loss = run_steps_ > 0 ? run_loss_ / static_cast<double>(run_steps_) : 0.0;
  const double samples = static_cast<double>(steps * args_.per_device_train_batch_size *
                                             args_.gradient_accumulation_steps * dp_size_);
  out.metrics = {{"train_runtime", runtime},
                 {"train_samples_per_second", runtime > 0 ? samples / runtime : 0.0},
                 {"train_steps_per_second", runtime > 0 ? static_cast<double>(steps) / runtime : 0.0},
                 {"train_tokens_per_second", runtime > 0 ? samples * static_cast<double>(train_->seq_len()) / runtime : 0.0},
                 {"train_loss", out.training_loss},
                 {"total_flos", state_.total_flos}};
  log(out.metrics);
  for (auto& cb : callbacks_) cb->on_train_end(args_, state_);
  return out;
}

json Trainer::evaluate() {
  TP_CHECK(eval_ != nullptr, "evaluate: the Trainer was given no eval data");
  autograd::NoGradGuard no_grad;
  const auto start = Clock::now();
  const VocabSlice vocab{model_.lm().logits_vocab_start(loss_parallel_), model_.config().vocab_size,
                         loss_parallel_ ? &model_.mesh().group("tp") : nullptr};
  double loss_sum = 0;
  int64_t targets = 0, batches = 0;
  const int64_t B = args_.per_device_eval_batch_size;
  // Batch i goes to dp rank i % dp; the sums are added over dp.
  for (int64_t first = 0; first < eval_->size(); first += B, ++batches) {
    if (batches % dp_size_ != dp_rank_) continue;
    std::vector<int64_t> blocks;
    for (int64_t i = first; i < std::min(first + B, eval_->size()); ++i) blocks.push_back(i);
    Tensor ids = eval_->batch(blocks);
    loss_sum += loss_of(ids, ids, 1.0, vocab).loss.item();  // normalizer 1: the sum
    targets += count_targets(ids);
  }
  // FSDP: every dp rank runs as many forwards (each gathers every unit); the short ones run an ignored one.
  if (params_->fully_sharded() && batches % dp_size_ != 0 && dp_rank_ >= batches % dp_size_) {
    const MicroBatch idle = idle_micro_batch();
    loss_of(idle.input_ids, idle.labels, 1.0, vocab);
  }
  if (fsdp_) fsdp_->release();
  if (dp_ != nullptr) {
    loss_sum = sum_over_ranks(loss_sum, *dp_);
    Tensor t = Tensor::from_ints({targets}, {1});
    dp_->all_reduce(t);
    targets = t.to_int_vector()[0];
  }
  const double runtime = std::chrono::duration<double>(Clock::now() - start).count();
  const double loss = loss_sum / static_cast<double>(std::max<int64_t>(targets, 1));
  json logs = {{"eval_loss", loss},
               {"eval_perplexity", std::exp(loss)},
               {"eval_runtime", runtime},
               {"eval_samples_per_second", runtime > 0 ? static_cast<double>(eval_->size()) / runtime : 0.0},
               {"eval_steps_per_second", runtime > 0 ? static_cast<double>(batches) / runtime : 0.0}};
  log(logs);
  return logs;
}

}  // namespace tp::training
