#include "tp/models/auto.h"

#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>

#include "tp/autograd/tape.h"
#include "tp/distributed/process_group.h"
#include "tp/models/checkpoint.h"
#include "tp/models/config_check.h"
#include "tp/models/deepseek_v2.h"
#include "tp/models/gemma3.h"
#include "tp/models/loader.h"
#include "tp/models/phi3.h"
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
// DeepSeek-V3 is V2's module tree; its differences are in the config it reads (deepseek_v2.h).
std::unique_ptr<CausalLM> deepseek(const ModelConfig& c) { return std::make_unique<DeepseekV2ForCausalLM>(c); }
std::unique_ptr<CausalLM> phi3(const ModelConfig& c) { return std::make_unique<Phi3ForCausalLM>(c); }
std::unique_ptr<CausalLM> gemma3(const ModelConfig& c) { return std::make_unique<Gemma3ForCausalLM>(c); }

const std::vector<std::pair<std::string, Factory>>& architectures() {
  static const std::vector<std::pair<std::string, Factory>> list = {{"llama", llama_family<llama_variant>},
                                                                    {"mistral", llama_family<mistral_variant>},
                                                                    {"qwen3", llama_family<qwen3_variant>},
                                                                    {"qwen2", llama_family<qwen2_variant>},
                                                                    {"mixtral", llama_family<mixtral_variant>},
                                                                    {"qwen3_moe", llama_family<qwen3_moe_variant>},
                                                                    {"gpt_oss", llama_family<gpt_oss_variant>},
                                                                    {"deepseek_v2", deepseek},
                                                                    {"deepseek_v3", deepseek},
                                                                    {"phi3", phi3},
                                                                    {"gemma3_text", gemma3}};
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
  const int64_t ep = dc.ep_size.value_or(1);
  TP_CHECK(tp >= 1, "tp_size must be >= 1, got {}", tp);
  TP_CHECK(ep >= 1, "Parallelism sizes must be >= 1: ep_size is {}", ep);
  if (ep > 1) {
    TP_CHECK(ep == world_size,
             "ep_size {} does not match the number of processes ({}); expert parallelism spans every rank (launch "
             "with `tprun --nproc-per-node {}`)",
             ep, world_size, ep);
    return tp;  // the plan's rules check tp against ep (resolve_model_plan)
  }
  TP_CHECK(tp == world_size,
           "tp_size {} does not match the number of processes ({}); launch with `tprun --nproc-per-node {}` or leave "
           "tp_size unset",
           tp, world_size, tp);
  return tp;
}

std::shared_ptr<const dist::DeviceMesh> make_model_mesh(int64_t tp_size, int64_t ep_size) {
  if (ep_size <= 1) return std::make_shared<dist::DeviceMesh>(dist::DeviceMesh::tp_mesh(tp_size));
  // tp innermost; "ep" is every rank (the tp groups side by side).
  dist::DeviceMesh mesh({ep_size / tp_size, tp_size}, {"ep_replicas", "tp"});
  return std::make_shared<dist::DeviceMesh>(mesh.with_flattened({"ep_replicas", "tp"}, "ep"));
}

std::vector<parallel::ParamRef> param_refs(CausalLM& model) {
  std::vector<parallel::ParamRef> refs;
  for (nn::Module* m : model.modules())
    for (nn::Parameter* p : m->own_parameters()) refs.push_back({p->name, m->name(), p->global_shape});
  return refs;
}

namespace {

// The shipped ep plan with the user's merged over it, checked by Transformers' rules.
parallel::Plan resolve_ep_plan(const CausalLM& model, const DistributedConfig& dc, int64_t tp_size,
                               const std::vector<parallel::ParamRef>& params, const std::vector<std::string>& modules) {
  const int64_t ep = dc.ep_size.value_or(1);
  parallel::Plan plan = model.shipped_ep_plan();
  TP_CHECK(!plan.empty(), "model_type '{}' has no experts to split (no base_model_ep_plan); leave ep_size unset",
           model.config().model_type);
  if (dc.ep_plan != "auto" && !dc.ep_plan.empty()) {
    const parallel::Plan user = parallel::parse_user_plan(dc.ep_plan);
    for (const auto& [key, style] : user) {
      bool found = std::any_of(plan.begin(), plan.end(), [&](const auto& e) { return e.first == key; }) ||
                   std::any_of(params.begin(), params.end(), [&](const auto& p) { return parallel::key_matches(key, p.name); }) ||
                   std::any_of(modules.begin(), modules.end(), [&](const auto& m) { return parallel::key_matches(key, m); });
      TP_CHECK(found,
               "The `ep_plan` pattern '{}' does not match any module, parameter, or existing plan entry in {}. Check "
               "the full path, including any 'model.' prefix.",
               key, model.config().model_type);
    }
    plan = parallel::merge_plans(plan, user);
  }
  auto uses = [&](const char* style) {
    return std::any_of(plan.begin(), plan.end(), [&](const auto& e) { return e.second == style; });
  };
  if (uses("ep_dispatch_experts")) {
    TP_CHECK(ep % tp_size == 0, "`ep_size` must be a multiple of `tp_size` for token dispatch. (ep_size {}, tp_size {})",
             ep, tp_size);
  } else {
    TP_CHECK(uses("ep_router") && uses("moe_tp_experts"),
             "Invalid expert plan. Must contain either 'ep_dispatch_experts' for all-to-all dispatch or 'ep_router' "
             "and 'moe_tp_experts' for all-reduce masked EP.");
    TP_CHECK(ep == tp_size,
             "All-reduce EP requires `ep_size=tp_size` and identical tokens per EP group. (ep_size {}, tp_size {}; "
             "the ep_plan masks experts with ep_router; use tp_size {} or an ep_plan with ep_dispatch_experts)",
             ep, tp_size, ep);
  }
  return plan;
}

// EP rules own the modules they name: the tp entries at or under them go.
parallel::Plan without_entries_under(const parallel::Plan& plan, const parallel::Plan& owners) {
  parallel::Plan out;
  for (const auto& entry : plan) {
    bool owned = std::any_of(owners.begin(), owners.end(), [&](const auto& o) {
      return entry.first == o.first || entry.first.compare(0, o.first.size() + 1, o.first + ".") == 0;
    });
    if (!owned) out.push_back(entry);
  }
  return out;
}

}  // namespace

parallel::ResolvedPlan resolve_model_plan(const CausalLM& model, const DistributedConfig& dc, int64_t tp_size,
                                          parallel::StyleOverrides* overrides) {
  auto& tree = const_cast<CausalLM&>(model);
  parallel::Plan user;
  if (dc.tp_plan != "auto" && !dc.tp_plan.empty()) user = parallel::parse_user_plan(dc.tp_plan);
  std::vector<std::string> modules;
  for (nn::Module* m : tree.modules())
    if (!m->name().empty()) modules.push_back(m->name());
  const std::vector<parallel::ParamRef> params = param_refs(tree);
  parallel::Plan shipped = model.shipped_plan();
  if (dc.ep_size.value_or(1) > 1) {
    const parallel::Plan ep_plan = resolve_ep_plan(model, dc, tp_size, params, modules);
    shipped = parallel::merge_plans(without_entries_under(shipped, ep_plan), ep_plan);
  }
  if (dc.enable_sequence_parallel) {
    const parallel::Plan sp = model.sequence_parallel_plan();
    TP_CHECK(!sp.empty(), "model_type '{}' has no sequence-parallel layout; turn enable_sequence_parallel off",
             model.config().model_type);
    shipped = parallel::merge_plans(shipped, sp);
  }
  parallel::ResolvedPlan plan = parallel::resolve_plan(shipped, user, params, modules);
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
  const DistributedConfig& dc = options.distributed_config;
  const int64_t ep = dc.ep_size.value_or(1);
  int64_t tp = 0;
  if (options.mesh) {
    // Styles and the loader use the mesh's "tp" (and "ep") dims only; other dims (data parallel) are the caller's.
    (void)options.mesh->dim_index("tp");
    TP_CHECK(ep == 1 || (options.mesh->has_dim("ep") && options.mesh->size("ep") == ep),
             "ep_size {} needs a mesh with an 'ep' dim of that size; the mesh given is {}", ep,
             options.mesh->to_string());
    m.mesh_ = options.mesh;
    tp = resolve_tp_size(dc, ep > 1 ? ep : m.mesh_->size("tp"));
    TP_CHECK(tp == m.mesh_->size("tp"), "tp_size {} does not match the mesh's 'tp' dim ({})", tp,
             m.mesh_->size("tp"));
    m.resolved_ = resolve_model_plan(*m.lm_, dc, tp, &m.overrides_);
  } else {
    tp = resolve_tp_size(dc, dist::world_size());
    m.resolved_ = resolve_model_plan(*m.lm_, dc, tp, &m.overrides_);  // checks tp against ep first
    m.mesh_ = make_model_mesh(tp, ep);
  }
  nn::TpRank rank{tp, m.mesh_->coordinate("tp"), ep, ep > 1 ? m.mesh_->coordinate("ep") : 0};
  parallel::apply_plan(*m.lm_, m.resolved_, rank, m.mesh_.get(), m.overrides_);
  m.set_up_vocab_parallel_head();
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

// A column-parallel lm_head (colwise_gather_output / colwise_rep / colwise) can
// hand a forward its vocabulary slice: plain colwise keeps the output Shard(-1),
// the same slices as the planned style without the gather (under sequence
// parallelism, colwise's sequence-parallel form). With one rank the slice is the
// whole vocabulary and the planned style serves.
void PretrainedModel::set_up_vocab_parallel_head() {
  nn::Module* head = lm_head_module();
  if (head == nullptr) return;
  if (tp_size() == 1) return lm_->set_vocab_parallel_head(true, head->style());
  auto it = resolved_.module_style.find("lm_head");
  if (it == resolved_.module_style.end() ||
      (it->second != "colwise_gather_output" && it->second != "colwise_rep" && it->second != "colwise"))
    return lm_->set_vocab_parallel_head(false, nullptr);
  const nn::TensorParallelLayer& colwise = parallel::get_style("colwise");
  sharded_head_style_ = resolved_.sequence_parallel ? colwise.sequence_parallel_variant(*head) : nullptr;
  lm_->set_vocab_parallel_head(true, sharded_head_style_ ? sharded_head_style_.get() : &colwise);
}

Tensor PretrainedModel::forward(const Tensor& ids) { return forward(ids, {}).logits; }

CausalLMOutput PretrainedModel::forward(const Tensor& ids, const ForwardOptions& options) {
  autograd::NoGradGuard no_grad;
  return lm_->forward_ids(ids, options);
}

}  // namespace tp
