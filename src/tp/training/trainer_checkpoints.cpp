// The Trainer's saving and resuming: save_model (save_pretrained's files, or an
// adapter's), checkpoint-<step> directories written whole or not at all, and a
// resume that refuses a checkpoint of another setup, naming what differs.
#include <filesystem>
#include <set>
#include <tuple>

#include "tp/io/json_file.h"
#include "tp/io/safetensors.h"
#include "tp/io/writer.h"
#include "tp/models/save_pretrained.h"
#include "tp/training/checkpoint.h"
#include "tp/training/trainer.h"

namespace tp::training {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Which rank's files of a checkpoint this rank writes and reads: its tp rank, or
// under expert parallelism its ep rank (each holds other experts).
int checkpoint_file_rank(const PretrainedModel& model) {
  return model.mesh().has_dim("ep") ? model.mesh().coordinate("ep") : model.tp_rank();
}

}  // namespace

void Trainer::save_model(const fs::path& dir) {
  SaveOptions o;
  const Tensor full = params_->full_masters();  // collective under sharded masters
  std::map<const nn::Parameter*, Tensor> masters;
  for (const TrainableParam& p : params_->params())
    for (const nn::Parameter* ref : p.refs) masters[ref] = ModelParameters::local_view(full, p);
  o.values = [&masters](const nn::Parameter& p) {
    auto it = masters.find(&p);
    return it == masters.end() ? p.data : it->second;
  };
  const fs::path out = dir.empty() ? fs::path(args_.output_dir) : dir;
  // Replicas hold the same weights: the first one's tp group writes them.
  if (dp_rank_ == 0) {
    if (options_.save_model)
      options_.save_model(out, o.values);
    else
      save_pretrained(model_, out, o);
  }
  if (dp_ != nullptr) job_->barrier();
}

json Trainer::checkpoint_identity() const {
  // In the slabs' order without FSDP (replicated, tp-sharded, expert-sharded; each in
  // the model's order), whatever this run's: checkpoints resume across layouts.
  std::vector<const TrainableParam*> order;
  for (const TrainableParam& p : params_->params()) order.push_back(&p);
  std::sort(order.begin(), order.end(), [](const TrainableParam* a, const TrainableParam* b) {
    return std::tuple(!a->replicated, a->expert_sharded, a->index) < std::tuple(!b->replicated, b->expert_sharded, b->index);
  });
  json params = json::array();
  for (const TrainableParam* p : order) params.push_back({p->name, p->global_shape});
  // The plan without the sequence-parallel layout's entries: they split no
  // parameter, so a run may resume with sequence parallelism turned on or off.
  std::set<std::pair<std::string, std::string>> layout;
  if (model_.sequence_parallel())
    for (const auto& entry : model_.lm().sequence_parallel_plan()) layout.insert(entry);
  json plan = json::object();
  for (const auto& [k, v] : model_.tp_plan())
    if (!layout.count({k, v})) plan[k] = v;
  json identity = {{"tp_size", model_.tp_size()},
                   {"tp_plan", plan},
                   {"model_type", model_.config().model_type},
                   {"parameters", params},
                   {"bf16", args_.bf16},
                   {"optimizer", optimizer_->name()},
                   {"train_data", {{"fingerprint", std::to_string(train_->fingerprint())},
                                   {"seq_len", train_->seq_len()},
                                   {"blocks", train_->size()}}},
                   // The global batch, not how it is split: a run may resume on another number of dp ranks.
                   {"total_train_batch_size",
                    args_.per_device_train_batch_size * args_.gradient_accumulation_steps * dp_size_}};
  if (model_.ep_size() > 1) identity["ep_size"] = model_.ep_size();
  return identity;
}

fs::path Trainer::save_checkpoint() {
  const int rank = checkpoint_file_rank(model_);
  // Files per tp rank, written by the first replica; the optimizer state is
  // gathered over dp_shard first, so a checkpoint does not depend on the dp layout.
  fs::path dir = write_checkpoint_dir(args_.output_dir, state_.global_step, *job_, [&](const fs::path& tmp) {
    const std::vector<std::pair<std::string, Tensor>> optimizer_state = optimizer_->state();  // collective
    const Tensor full = params_->full_masters();                                              // collective
    if (dp_rank_ != 0) return;
    std::vector<std::pair<std::string, Tensor>> masters;
    for (const TrainableParam& p : params_->params()) masters.emplace_back(p.name, ModelParameters::local_view(full, p));
    io::save_safetensors(tmp / rank_file("model", rank), masters);
    io::save_safetensors(tmp / rank_file("optimizer", rank), optimizer_state,
                         {{"format", "pt"}, {"optimizer", optimizer_->name()},
                          {"steps", std::to_string(optimizer_->steps())}});
    if (rank != 0) return;
    io::write_json_file(tmp / "trainer_state.json", state_.to_json());
    json counters = {{"window_loss", window_loss_}, {"window_aux_loss", window_aux_loss_},
                     {"window_steps", window_steps_}};
    io::write_json_file(tmp / "training_state.json",
                        {{"identity", checkpoint_identity()}, {"counters", counters}, {"args", args_.to_json()}});
    io::write_json_file(tmp / "config.json", model_.config().to_json());
  });
  if (job_->rank() == 0 && args_.save_total_limit) rotate_checkpoints(args_.output_dir, *args_.save_total_limit);
  for (auto& cb : callbacks_) cb->on_save(args_, state_, dir);
  return dir;
}

namespace {

// Runs `read` over the JSON of `file`, a checkpoint's: a missing or mistyped field
// (a hand-edited or damaged file) is an error naming the file and json's reason.
template <class Read>
auto checkpoint_fields(const fs::path& file, Read&& read) {
  try {
    return read();
  } catch (const json::exception& e) {
    fail("{}: {}", file.string(), e.what());
  }
}

}  // namespace

void Trainer::load_checkpoint(const fs::path& dir) {
  TP_CHECK(fs::is_directory(dir), "resume_from_checkpoint: {} is not a directory", dir.string());
  TP_CHECK(fs::exists(dir / "training_state.json"),
           "resume_from_checkpoint: {} is not a tp training checkpoint (no training_state.json)", dir.string());
  const fs::path saved_file = dir / "training_state.json";
  json saved = io::read_json_file(saved_file);
  const json now = checkpoint_identity(), then = checkpoint_fields(saved_file, [&] { return saved.at("identity"); });
  std::vector<std::string> differences;
  for (const auto& [key, value] : now.items()) {
    if (!then.contains(key)) {
      differences.push_back(fmt::format("{}: absent in the checkpoint, {} now", key, value.dump()));
    } else if (then[key] != value) {
      std::string a = then[key].dump(), b = value.dump();
      if (a.size() > 120) a = a.substr(0, 117) + "...";
      if (b.size() > 120) b = b.substr(0, 117) + "...";
      differences.push_back(fmt::format("{}: {} in the checkpoint, {} now", key, a, b));
    }
  }
  TP_CHECK(differences.empty(), "cannot resume from {}: the run differs from the one that saved it ({})",
           dir.string(), fmt::join(differences, "; "));

  const int rank = checkpoint_file_rank(model_);
  auto model_file = io::SafetensorsFile::open(dir / rank_file("model", rank));
  Tensor full = Tensor::zeros({params_->numel()});  // this tp rank's masters, whatever the dp layout
  for (TrainableParam& p : params_->params()) {
    const io::TensorInfo* info = model_file->find(p.name);
    TP_CHECK(info != nullptr, "{}: no tensor '{}'", model_file->path().string(), p.name);
    TP_CHECK(info->shape == p.grad.shape(), "{}: tensor '{}' has shape {}, this rank's shard is {}",
             model_file->path().string(), p.name, shape_str(info->shape), shape_str(p.grad.shape()));
    ModelParameters::local_view(full, p).copy_from(model_file->read(p.name, DType::F32));
  }
  params_->load_masters(full);

  auto opt_file = io::SafetensorsFile::open(dir / rank_file("optimizer", rank));
  std::vector<std::pair<std::string, Tensor>> state;
  for (const io::TensorInfo& t : opt_file->tensors()) state.emplace_back(t.name, opt_file->read(t.name, DType::F32));
  auto steps = opt_file->metadata().find("steps");
  TP_CHECK(steps != opt_file->metadata().end(), "{}: no 'steps' in its metadata", opt_file->path().string());
  const std::string& step_text = steps->second;
  TP_CHECK(
      !step_text.empty() && step_text.size() < 19 && step_text.find_first_not_of("0123456789") == std::string::npos,
      "{}: metadata 'steps' must be a step count, got '{}'", opt_file->path().string(), step_text);
  optimizer_->load_state(state, std::stoll(step_text));

  const fs::path state_file = dir / "trainer_state.json";
  const json state_json = io::read_json_file(state_file);
  state_ = checkpoint_fields(state_file, [&] { return TrainerState::from_json(state_json); });
  state_.max_steps = total_steps_;
  checkpoint_fields(saved_file, [&] {
    window_loss_ = saved.at("counters").at("window_loss").get<double>();
    window_steps_ = saved.at("counters").at("window_steps").get<int64_t>();
    window_aux_loss_ = saved.at("counters").value("window_aux_loss", 0.0);
  });
}

}  // namespace tp::training
