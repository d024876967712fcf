#include "tp/models/auto.h"

#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>

#include "tp/autograd/tape.h"
#include "tp/dist/process_group.h"
#include "tp/models/checkpoint.h"
#include "tp/models/config_check.h"
#include "tp/models/deepseek_v2.h"
#include "tp/models/loader.h"
#include "tp/models/variants.h"
#include "tp/parallel/apply.h"
#include "tp/parallel/registry.h"
#include "tp/parallel/sequence.h"

namespace tp {

namespace {

using Factory = std::unique_ptr<CausalLM> (*)(const ModelConfig&);
template <LlamaVariant (*variant)(const ModelConfig&)>
std::unique_ptr<CausalLM> llama_family(const ModelConfig& c) {
  return std::make_unique<LlamaForCausalLM>(c, variant(c));
}
std::unique_ptr<CausalLM> deepseek_v2(const ModelConfig& c) { return std::make_unique<DeepseekV2ForCausalLM>(c); }

const std::vector<std::pair<std::string, Factory>>& architectures() {
  static const std::vector<std::pair<std::string, Factory>> list = {{"llama", llama_family<llama_variant>},
                                                                    {"mistral", llama_family<mistral_variant>},
                                                                    {"qwen3", llama_family<qwen3_variant>},
                                                                    {"deepseek_v2", deepseek_v2}};
  return list;
}

DType default_dtype(const ModelConfig& c) {
  if (c.torch_dtype == "bfloat16") return DType::BF16;
  return DType::F32;  // float32, and float16 (computed in f32 on CPU)
}

}  // namespace

std::vector<std::string> AutoModelForCausalLM::supported_model_types() {
  std::vector<std::string> names;
  for (const auto& [name, fn] : architectures()) names.push_back(name);
  return names;
}

std::unique_ptr<CausalLM> AutoModelForCausalLM::from_config(const ModelConfig& config) {
  check_module_tree_fits(config, physical_memory_bytes());
  for (const auto& [name, make] : architectures())
    if (name == config.model_type) return make(config);
  fail("model_type '{}' is not supported; supported: {}", config.model_type,
       fmt::join(supported_model_types(), ", "));
}

int64_t resolve_tp_size(const DistributedConfig& dc, int64_t world_size) {
  int64_t tp = dc.tp_size.value_or(world_size);
  TP_CHECK(tp >= 1, "tp_size must be >= 1, got {}", tp);
  TP_CHECK(tp == world_size,
           "tp_size {} does not match the number of processes ({}); launch with `tprun --nproc-per-node {}` or leave "
           "tp_size unset",
           tp, world_size, tp);
  return tp;
}

std::vector<parallel::ParamRef> param_refs(CausalLM& model) {
  std::vector<parallel::ParamRef> refs;
  for (nn::Module* m : model.modules())
    for (nn::Parameter* p : m->own_parameters()) refs.push_back({p->name, m->name(), p->global_shape});
  return refs;
}

parallel::ResolvedPlan resolve_model_plan(const CausalLM& model, const DistributedConfig& dc, int64_t tp_size,
                                          parallel::StyleOverrides* overrides) {
  auto& tree = const_cast<CausalLM&>(model);
  parallel::Plan user;
  if (dc.tp_plan != "auto" && !dc.tp_plan.empty()) user = parallel::parse_user_plan(dc.tp_plan);
  std::vector<std::string> modules;
  for (nn::Module* m : tree.modules())
    if (!m->name().empty()) modules.push_back(m->name());
  parallel::Plan shipped = model.shipped_plan();
  if (dc.enable_sequence_parallel) {
    const parallel::Plan sp = model.sequence_parallel_plan();
    TP_CHECK(!sp.empty(), "model_type '{}' has no sequence-parallel layout; turn enable_sequence_parallel off",
             model.config().model_type);
    shipped = parallel::merge_plans(shipped, sp);
  }
  parallel::ResolvedPlan plan = parallel::resolve_plan(shipped, user, param_refs(tree), modules);
  parallel::StyleOverrides o = model.check_tp(plan, tp_size);
  if (dc.enable_sequence_parallel) {
    parallel::use_sequence_parallel_styles(plan, tree, o);
    plan.sequence_parallel = true;
  }
  if (overrides != nullptr) *overrides = std::move(o);
  return plan;
}

PretrainedModel AutoModelForCausalLM::from_pretrained(const std::filesystem::path& dir, const LoadOptions& options) {
  dist::init();
  Checkpoint ckpt = Checkpoint::open(dir);
  PretrainedModel m;
  m.lm_ = from_config(ckpt.config());
  if (options.mesh) {
    // Styles and the loader use the mesh's "tp" dimension only; other dims (data parallel) are the caller's.
    (void)options.mesh->dim_index("tp");
    m.mesh_ = options.mesh;
  } else {
    m.mesh_ = std::make_shared<dist::DeviceMesh>(dist::DeviceMesh::tp_mesh(dist::world_size()));
  }
  int64_t tp = resolve_tp_size(options.distributed_config, m.mesh_->size("tp"));
  m.resolved_ = resolve_model_plan(*m.lm_, options.distributed_config, tp, &m.overrides_);
  parallel::TpRank rank{tp, m.mesh_->coordinate("tp")};
  parallel::apply_plan(*m.lm_, m.resolved_, rank, m.mesh_.get(), m.overrides_);
  if (options.verbose && rank.rank == 0)
    for (const std::string& w : m.resolved_.warnings) std::cerr << "warning: " << w << "\n";
  load_parameters(*m.lm_, ckpt, options.dtype.value_or(default_dtype(ckpt.config())), m.lm_->tied_parameters(),
                  options.inference_only, options.pack_weights);
  m.source_dir_ = dir;
  for (const std::string& name : ckpt.tensor_names()) {
    const io::TensorInfo& info = ckpt.info(name);
    m.source_tensors_.push_back({name, info.dtype, info.shape});
  }
  return m;
}

nn::Module* PretrainedModel::lm_head_module() const {
  for (nn::Module* m : lm_->modules())
    if (m->name() == "lm_head") return m;
  return nullptr;
}

bool PretrainedModel::can_shard_logits() const {
  if (tp_size() == 1) return lm_head_module() != nullptr;
  auto it = resolved_.module_style.find("lm_head");
  if (it == resolved_.module_style.end()) return false;
  return it->second == "colwise_gather_output" || it->second == "colwise_rep" || it->second == "colwise";
}

void PretrainedModel::set_sharded_logits(bool on) {
  if (on == sharded_logits_) return;
  TP_CHECK(!on || can_shard_logits(), "vocab-parallel logits need a column-parallel lm_head; this plan has '{}'",
           resolved_.module_style.count("lm_head") ? resolved_.module_style.at("lm_head") : "no style");
  sharded_logits_ = on;
  if (tp_size() == 1) return;
  nn::Module* head = lm_head_module();
  if (!on) {
    head->set_style(&parallel::style_for("lm_head", resolved_.module_style.at("lm_head"), overrides_), mesh_.get());
    return;
  }
  // colwise keeps the output Shard(-1): the same slices as the planned style, without the gather.
  const parallel::TensorParallelLayer& colwise = parallel::get_style("colwise");
  sharded_head_style_ = resolved_.sequence_parallel ? colwise.sequence_parallel_variant(*head) : nullptr;
  head->set_style(sharded_head_style_ ? sharded_head_style_.get() : &colwise, mesh_.get());
}

int64_t PretrainedModel::logits_vocab_start() const {
  if (!sharded_logits_ || tp_size() == 1) return 0;
  const nn::Parameter* w = lm_head_module()->own_parameters().at(0);
  return w->shard.replicated() ? 0 : w->shard.spans.at(0).offset;
}

Tensor PretrainedModel::forward(const Tensor& ids) {
  autograd::NoGradGuard no_grad;
  return lm_->forward_ids(ids);
}

std::ostream& operator<<(std::ostream& out, const parallel::Plan& plan) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [key, style] : plan) j[key] = style;
  return out << j.dump(2);
}

}  // namespace tp
