#include "tp/training/lora.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <regex>
#include <set>

#include "tp/autograd/checkpoint.h"
#include "tp/autograd/tape.h"
#include "tp/distributed/functional.h"
#include "tp/models/presets.h"  // param_seed
#include "tp/ops/dropout.h"
#include "tp/ops/elementwise.h"
#include "tp/ops/embedding.h"
#include "tp/ops/linear.h"
#include "tp/ops/shape.h"
#include "tp/parallel/shards.h"
#include "tp/tensor/random.h"

namespace tp::training {

namespace {

constexpr const char* kPeftPrefix = "base_model.model.";

// This rank's slice of a full tensor.
Tensor local_slice(const Tensor& full, const nn::ParamShard& shard) {
  if (shard.replicated()) return full.clone();
  std::vector<Tensor> pieces;
  for (const ChunkSpan& s : shard.spans) pieces.push_back(full.narrow(shard.dim, s.offset, s.size));
  return cat(pieces, shard.dim);
}

bool targeted(const std::string& module, const std::optional<std::regex>& pattern,
              const std::vector<std::string>& targets, std::vector<bool>& used) {
  if (pattern) return std::regex_match(module, *pattern);
  for (size_t i = 0; i < targets.size(); ++i) {
    const std::string& t = targets[i];
    if (module == t || module.ends_with("." + t)) {
      used[i] = true;
      return true;
    }
  }
  return false;
}

}  // namespace

// The adapter of one Linear or Embedding: see lora.h for the layout.
class LoraAdapter : public nn::Adapter {
 public:
  LoraAdapter(nn::Parameter& a, nn::Parameter& b, bool embedding, double scaling, double dropout, uint64_t seed)
      : A(a), B(b), embedding_(embedding), scaling_(scaling), dropout_(dropout), seed_(seed) {}

  nn::Parameter& A;
  nn::Parameter& B;
  // The ranks that share this rank's slice of A / B and sum its gradient (null: none).
  std::shared_ptr<dist::ProcessGroup> sum_A, sum_B;
  // Where this rank's slice of A's input dimension starts (a row-parallel base's
  // input columns, a vocab-parallel embedding's rows).
  int64_t in_offset = 0;
  bool enabled = true;
  // The lora_A / lora_B modules of a Linear: their compute dtype is the step's
  // (mixed precision sets it on every Linear); unset for an embedding.
  const nn::Linear* modules[2] = {nullptr, nullptr};

  void begin_step(int64_t step, int64_t first_row) {
    step_ = step;
    first_row_ = first_row;
    calls_ = 0;
  }

  Tensor forward(const Tensor& input, const Tensor& base_out) override {
    if (!enabled) return base_out;
    const bool training = autograd::needs_grad({A.data, B.data});
    // fwd identity, bwd sum of the parameter's gradient over the ranks sharing it.
    auto param = [&](nn::Parameter& p, const std::shared_ptr<dist::ProcessGroup>& sum) {
      return sum != nullptr && training ? dist::copy_to_region(p.data, *sum) : p.data;
    };
    const Tensor a = param(A, sum_A), b = param(B, sum_B);
    Tensor h;
    if (embedding_) {
      h = ops::embedding(input, ops::transpose(a, 0, 1), in_offset);  // rows of A^T: [..., r]
    } else {
      const Tensor x = input.dtype() == DType::BF16 ? input.to(DType::F32) : input;
      h = ops::linear(dropout_ > 0 && training ? ops::mul(x, dropout_mask(x.shape())) : x, a, Tensor(),
                      modules[0]->compute_dtype);
    }
    const std::optional<DType> compute = modules[1] ? modules[1]->compute_dtype : std::nullopt;
    // Scaled while r wide: one activation-sized temporary fewer per adapted module.
    return ops::add(base_out, ops::linear(ops::scale(h, scaling_), b, Tensor(), compute));
  }

 private:
  // Keep (1 / (1 - p)) or drop (0) each element, from (seed, step, call, global index).
  Tensor dropout_mask(const Shape& shape) {
    // A checkpointed layer's recompute draws the mask its forward drew.
    const std::optional<uint64_t> replayed = autograd::replayed_value();
    const uint64_t call = replayed ? *replayed : calls_++;
    autograd::keep_value(call);
    const uint64_t stream = mix64(seed_ ^ mix64(static_cast<uint64_t>(step_) * 1000003u + call));
    return ops::dropout_mask(shape, dropout_, stream,
                             {.first_row = first_row_, .first_col = in_offset, .full_cols = A.global_shape[1]});
  }

  bool embedding_;
  double scaling_, dropout_;
  uint64_t seed_;
  int64_t step_ = 0, first_row_ = 0;
  uint64_t calls_ = 0;
};

bool LoraModel::is_adapter_parameter(const std::string& name) {
  return name.ends_with(".lora_A.weight") || name.ends_with(".lora_B.weight") ||
         name.ends_with(".lora_embedding_A") || name.ends_with(".lora_embedding_B");
}

std::string LoraModel::peft_key(const std::string& name) { return kPeftPrefix + name; }

void LoraModel::begin_step(int64_t step, int64_t first_row) {
  for (AdaptedModule& a : adapted_) a.adapter->begin_step(step, first_row);
}

void LoraModel::merge_into_base() {
  autograd::NoGradGuard no_grad;
  for (AdaptedModule& a : adapted_) {
    Tensor& w = a.base_weight->data;
    const auto* linear = dynamic_cast<const nn::Linear*>(a.base);
    TP_CHECK(linear == nullptr || !linear->quantized().defined(),
             "merge: '{}' is quantized ({}-bit codes): an adapter trained over quantized codes merges into the "
             "unquantized model they came from (load that checkpoint to merge), not into the codes",
             a.base->name(), linear->quantized().bits());
    TP_CHECK(w.defined(), "merge: '{}' has no plain weight (load the model without packing to merge)", a.base->name());
    // This rank's slice of the update, for either layout: Linear B A = linear(B, A^T)
    // [out, in]; Embedding A^T B^T = linear(A^T, B) [V, H].
    const Tensor a_t = ops::transpose(a.A->data, 0, 1);
    const bool embedding = dynamic_cast<nn::Embedding*>(a.base) != nullptr;
    Tensor delta = ops::scale(embedding ? ops::linear(a_t, a.B->data) : ops::linear(a.B->data, a_t), config_.scaling());
    Tensor merged = ops::add(w.dtype() == DType::F32 ? w : w.to(DType::F32), delta);
    w = merged.dtype() == w.dtype() ? merged : merged.to(w.dtype());
    a.base->release_packed_weights();
    a.adapter->enabled = false;
  }
}

std::function<Tensor(const nn::Parameter&)> peft_init(uint64_t seed) {
  return [seed](const nn::Parameter& p) {
    if (p.name.ends_with(".lora_B.weight") || p.name.ends_with(".lora_embedding_A")) return Tensor::zeros(p.global_shape);
    if (p.name.ends_with(".lora_embedding_B")) return Tensor::randn(p.global_shape, param_seed(seed, p.name));
    const float bound = 1.0f / std::sqrt(static_cast<float>(p.global_shape[1]));
    return Tensor::rand(p.global_shape, param_seed(seed, p.name), -bound, bound);
  };
}

LoraModel apply_lora(PretrainedModel& model, const LoraConfig& config,
                     const std::function<Tensor(const nn::Parameter&)>& values) {
  config.validate("LoraConfig");
  const std::vector<std::string> targets = config.targets_for(model.lm().default_lora_targets(), model.config().model_type);
  std::vector<bool> used(targets.size(), false);
  std::optional<std::regex> pattern;  // validate() checked that it compiles
  if (config.target_regex) pattern.emplace(*config.target_regex);
  std::vector<nn::Module*> bases;
  std::vector<std::string> names;  // the last parts of the adaptable modules' names, for errors
  for (nn::Module* m : model.lm().modules()) {
    const bool linear = dynamic_cast<nn::Linear*>(m) != nullptr, embedding = dynamic_cast<nn::Embedding*>(m) != nullptr;
    if (!(linear || embedding) || m->name().find(".lora_") != std::string::npos) continue;
    names.push_back(m->name().substr(m->name().rfind('.') + 1));
    if (targeted(m->name(), pattern, targets, used)) bases.push_back(m);
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  for (size_t i = 0; i < targets.size(); ++i)
    TP_CHECK(used[i], "LoRA: target module '{}' matches no Linear or Embedding module of this {} model; they are "
             "named {}", targets[i], model.config().model_type, fmt::join(names, ", "));
  TP_CHECK(!bases.empty(), "LoRA: target_modules regex '{}' matches no Linear or Embedding module; they are named {}",
           config.target_regex.value_or(""), fmt::join(names, ", "));

  dist::ProcessGroup& tp = model.mesh().group("tp");
  // Groups of ranks sharing a slice, one per partition of the tp ranks: made
  // collectively (every rank decides from every rank's shards alike), kept by the adapters.
  std::map<std::vector<int>, std::shared_ptr<dist::ProcessGroup>> groups;
  auto sharing = [&](const nn::Parameter& p) -> std::shared_ptr<dist::ProcessGroup> {
    std::vector<nn::ParamShard> shards = parallel::all_shards(p.shard, tp);
    std::vector<int> color(shards.size());
    for (size_t r = 0; r < shards.size(); ++r) color[r] = parallel::first_holder(shards, static_cast<int>(r));
    if (std::set<int>(color.begin(), color.end()).size() == color.size()) return nullptr;  // no slice shared
    std::shared_ptr<dist::ProcessGroup>& g = groups[color];
    if (g == nullptr) g = tp.split(color[tp.rank()], tp.rank());
    return g->size() > 1 ? g : nullptr;
  };

  LoraModel out;
  out.config_ = config;
  const int64_t r = config.r;
  for (nn::Module* base : bases) {
    auto* linear = dynamic_cast<nn::Linear*>(base);
    auto* embedding = dynamic_cast<nn::Embedding*>(base);
    TP_CHECK((linear ? linear->adapter() : embedding->adapter()) == nullptr, "LoRA: '{}' already has an adapter",
             base->name());
    nn::Parameter& w = linear ? linear->weight : embedding->weight;
    nn::Parameter *A, *B;
    nn::Linear* modules[2] = {nullptr, nullptr};
    int64_t out_dim;  // the base output's dim in W: rows of a Linear weight, columns of an embedding table
    if (linear) {
      modules[0] = &base->adopt(std::make_unique<nn::Linear>(base->name() + ".lora_A", linear->in_features(), r, false));
      modules[1] = &base->adopt(std::make_unique<nn::Linear>(base->name() + ".lora_B", r, linear->out_features(), false));
      A = &modules[0]->weight;
      B = &modules[1]->weight;
      out_dim = 0;
    } else {
      A = &base->adopt_parameter("lora_embedding_A", {r, w.global_shape[0]});
      B = &base->adopt_parameter("lora_embedding_B", {w.global_shape[1], r});
      out_dim = 1;
    }
    const nn::ParamShard& ws = w.shard;
    int64_t in_offset = 0;
    if (!ws.replicated()) {
      TP_CHECK(std::holds_alternative<dist::Shard>(ws.placement) && ws.spans.size() == 1,
               "LoRA: '{}' is split by a style with no LoRA layout (a packed or strided weight); LoRA supports "
               "column-parallel, row-parallel and replicated modules", base->name());
      if (ws.dim == out_dim) {
        B->shard = ws;  // the output split like the base's: B's rows
        B->shard.dim = 0;
        B->shard.placement = dist::Shard{0};
      } else {
        A->shard = ws;  // the input (or vocabulary) split like the base's: A's columns
        A->shard.dim = 1;
        A->shard.placement = dist::Shard{1};
        in_offset = ws.spans[0].offset;
      }
    }
    for (nn::Parameter* f : {A, B}) {
      Tensor full = values(*f);
      TP_CHECK(full.defined() && full.shape() == f->global_shape, "LoRA: '{}' should be {}, got {}",
               LoraModel::peft_key(f->name), shape_str(f->global_shape),
               full.defined() ? shape_str(full.shape()) : std::string("nothing"));
      f->data = local_slice(full.dtype() == DType::F32 ? full : full.to(DType::F32), f->shard);
    }
    auto adapter = std::make_unique<LoraAdapter>(*A, *B, embedding != nullptr, config.scaling(), config.lora_dropout,
                                                 param_seed(0x10a4, base->name()));
    adapter->in_offset = in_offset;
    adapter->modules[0] = modules[0];
    adapter->modules[1] = modules[1];
    if (!ws.replicated()) {  // a replicated base: every rank computes the whole gradient already
      adapter->sum_A = sharing(*A);
      adapter->sum_B = sharing(*B);
    }
    out.adapted_.push_back({base, &w, A, B, adapter.get()});
    if (linear)
      linear->set_adapter(std::move(adapter));
    else
      embedding->set_adapter(std::move(adapter));
  }
  return out;
}

}  // namespace tp::training
