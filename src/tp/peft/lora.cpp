#include "tp/peft/lora.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <regex>
#include <set>

#include "tp/autograd/tape.h"
#include "tp/ops/elementwise.h"
#include "tp/ops/linear.h"
#include "tp/ops/shape.h"
#include "tp/parallel/shards.h"
#include "tp/parallel/style_util.h"
#include "tp/tensor/random.h"

namespace tp::peft {

namespace {

constexpr const char* kPeftPrefix = "base_model.model.";

uint64_t name_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char ch : name) h = (h ^ ch) * 0x100000001b3ull;
  return mix64(seed ^ mix64(h));
}

// This rank's slice of a full tensor.
Tensor local_slice(const Tensor& full, const parallel::ParamShard& shard) {
  if (shard.replicated()) return full.clone();
  std::vector<Tensor> pieces;
  for (const ChunkSpan& s : shard.spans) pieces.push_back(full.narrow(shard.dim, s.offset, s.size));
  return cat(pieces, shard.dim);
}

bool targeted(const std::string& module, const LoraConfig& c, const std::vector<std::string>& targets,
              std::vector<bool>& used) {
  if (c.target_regex) return std::regex_match(module, std::regex(*c.target_regex));
  for (size_t i = 0; i < targets.size(); ++i) {
    const std::string& t = targets[i];
    if (module == t || (module.size() > t.size() && module.compare(module.size() - t.size(), t.size(), t) == 0 &&
                        module[module.size() - t.size() - 1] == '.')) {
      used[i] = true;
      return true;
    }
  }
  return false;
}

}  // namespace

// The adapter of one Linear: see lora.h for the layout.
class LoraLinear : public nn::LinearAdapter {
 public:
  LoraLinear(nn::Linear& a, nn::Linear& b, double scaling, double dropout, uint64_t seed)
      : A(a), B(b), scaling_(scaling), dropout_(dropout), seed_(seed) {}

  nn::Linear& A;
  nn::Linear& B;
  // The ranks that share this rank's slice of A / B and sum its gradient (null: none).
  std::shared_ptr<dist::ProcessGroup> sum_A, sum_B;
  int64_t in_offset = 0;  // where this rank's input columns start in the full input (row-parallel base)
  bool enabled = true;

  void begin_step(int64_t step) {
    step_ = step;
    calls_ = 0;
  }

  Tensor forward(const Tensor& x, const Tensor& base_out) override {
    if (!enabled) return base_out;
    const Tensor xf = x.dtype() == DType::BF16 ? x.to(DType::F32) : x;
    const bool training = autograd::needs_grad({A.weight.data, B.weight.data});
    Tensor h = dropout_ > 0 && training ? ops::mul(xf, dropout_mask(xf.shape())) : xf;
    auto run = [&](nn::Linear& m, const std::shared_ptr<dist::ProcessGroup>& sum, const Tensor& in) {
      if (sum == nullptr || !training) return m(in);
      return parallel::with_grad_allreduced_params(m, [&] { return m(in); }, *sum);
    };
    Tensor ab = run(B, sum_B, run(A, sum_A, h));
    return ops::add(base_out, ops::scale(ab, scaling_));
  }

 private:
  // Keep (1 / (1 - p)) or drop (0) each element, from (seed, step, call, global index).
  Tensor dropout_mask(const Shape& shape) {
    const int64_t cols = shape.back(), rows = numel(shape) / cols, full_cols = A.in_features();
    const uint64_t stream = mix64(seed_ ^ mix64(static_cast<uint64_t>(step_) * 1000003u + calls_++));
    Tensor m = Tensor::empty(shape);
    float* p = m.data<float>();
    const float keep = static_cast<float>(1.0 / (1.0 - dropout_));
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        const uint64_t index = static_cast<uint64_t>(i * full_cols + in_offset + j);
        p[i * cols + j] = uniform01(stream, index) >= dropout_ ? keep : 0.f;
      }
    return m;
  }

  double scaling_, dropout_;
  uint64_t seed_;
  int64_t step_ = 0;
  uint64_t calls_ = 0;
};

bool LoraModel::is_adapter_parameter(const std::string& name) {
  auto ends = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return ends(".lora_A.weight") || ends(".lora_B.weight");
}

std::string LoraModel::peft_key(const std::string& name) { return kPeftPrefix + name; }

void LoraModel::begin_step(int64_t step) {
  for (AdaptedLinear& a : adapted_) a.adapter->begin_step(step);
}

void LoraModel::merge_into_base() {
  autograd::NoGradGuard no_grad;
  for (AdaptedLinear& a : adapted_) {
    Tensor& w = a.base->weight.data;
    TP_CHECK(w.defined(), "merge: '{}' has no plain weight (load the model without packing to merge)", a.base->name());
    // [out_local, r] x [r, in_local]: this rank's slice of B A for either layout.
    const Tensor a_t = ops::transpose(a.lora_A->weight.data, 0, 1);  // [in_local, r]: linear(B, A^T) = B A
    Tensor delta = ops::scale(ops::linear(a.lora_B->weight.data, a_t), config_.scaling());
    Tensor merged = ops::add(w.dtype() == DType::F32 ? w : w.to(DType::F32), delta);
    w = merged.dtype() == w.dtype() ? merged : merged.to(w.dtype());
    a.base->release_packed_weights();
    a.adapter->enabled = false;
  }
}

std::function<Tensor(const nn::Parameter&)> peft_init(uint64_t seed) {
  return [seed](const nn::Parameter& p) {
    const std::string b = ".lora_B.weight";
    if (p.name.size() > b.size() && p.name.compare(p.name.size() - b.size(), b.size(), b) == 0)
      return Tensor::zeros(p.global_shape);
    const float bound = 1.0f / std::sqrt(static_cast<float>(p.global_shape[1]));
    return Tensor::rand(p.global_shape, name_seed(seed, p.name), -bound, bound);
  };
}

LoraModel apply_lora(PretrainedModel& model, const LoraConfig& config,
                     const std::function<Tensor(const nn::Parameter&)>& values) {
  config.validate("LoraConfig");
  const std::vector<std::string> targets = config.targets_for(model.config().model_type);
  std::vector<bool> used(targets.size(), false);
  std::vector<nn::Linear*> bases;
  std::vector<std::string> linear_names;
  for (nn::Module* m : model.lm().modules()) {
    auto* linear = dynamic_cast<nn::Linear*>(m);
    if (linear == nullptr || linear->name().find(".lora_") != std::string::npos) continue;
    linear_names.push_back(linear->name().substr(linear->name().rfind('.') + 1));
    if (targeted(linear->name(), config, targets, used)) {
      TP_CHECK(linear->adapter() == nullptr, "LoRA: '{}' already has an adapter", linear->name());
      bases.push_back(linear);
    }
  }
  std::sort(linear_names.begin(), linear_names.end());
  linear_names.erase(std::unique(linear_names.begin(), linear_names.end()), linear_names.end());
  for (size_t i = 0; i < targets.size(); ++i)
    TP_CHECK(used[i], "LoRA: target module '{}' matches no Linear module of this {} model; its Linear modules are "
             "named {}", targets[i], model.config().model_type, fmt::join(linear_names, ", "));
  TP_CHECK(!bases.empty(), "LoRA: target_modules regex '{}' matches no Linear module; its Linear modules are named {}",
           config.target_regex.value_or(""), fmt::join(linear_names, ", "));

  dist::ProcessGroup& tp = model.mesh().group("tp");
  // Groups of ranks sharing a slice, one per partition of the tp ranks: made
  // collectively (every rank decides from every rank's shards alike), kept by the adapters.
  std::map<std::vector<int>, std::shared_ptr<dist::ProcessGroup>> groups;
  auto sharing = [&](const nn::Parameter& p) -> std::shared_ptr<dist::ProcessGroup> {
    std::vector<parallel::ParamShard> shards = parallel::all_shards(p.shard, tp);
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
  for (nn::Linear* base : bases) {
    auto& A = base->adopt(std::make_unique<nn::Linear>(base->name() + ".lora_A", base->in_features(), r, false));
    auto& B = base->adopt(std::make_unique<nn::Linear>(base->name() + ".lora_B", r, base->out_features(), false));
    const parallel::ParamShard& ws = base->weight.shard;
    int64_t in_offset = 0;
    if (!ws.replicated()) {
      TP_CHECK(std::holds_alternative<dist::Shard>(ws.placement) && ws.spans.size() == 1,
               "LoRA: '{}' is split by a style with no LoRA layout (a packed or strided weight); LoRA supports "
               "column-parallel, row-parallel and replicated Linear modules", base->name());
      if (ws.dim == 0) {
        B.weight.shard = ws;  // [out, r] split by rows like W
      } else {
        A.weight.shard = ws;  // [r, in] split by columns like W
        in_offset = ws.spans[0].offset;
      }
    }
    for (nn::Linear* f : {&A, &B}) {
      Tensor full = values(f->weight);
      TP_CHECK(full.defined() && full.shape() == f->weight.global_shape, "LoRA: '{}' should be {}, got {}",
               LoraModel::peft_key(f->weight.name), shape_str(f->weight.global_shape),
               full.defined() ? shape_str(full.shape()) : std::string("nothing"));
      f->weight.data = local_slice(full.dtype() == DType::F32 ? full : full.to(DType::F32), f->weight.shard);
    }
    auto adapter = std::make_unique<LoraLinear>(A, B, config.scaling(), config.lora_dropout,
                                                name_seed(0x10a4, base->name()));
    adapter->in_offset = in_offset;
    adapter->sum_A = sharing(A.weight);
    adapter->sum_B = sharing(B.weight);
    out.adapted_.push_back({base, &A, &B, adapter.get()});
    base->set_adapter(std::move(adapter));
  }
  return out;
}

}  // namespace tp::peft
