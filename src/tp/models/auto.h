#pragma once
// AutoModelForCausalLM: picks the architecture from config.json, resolves the
// tensor-parallel plan, checks every size the plan must split, and loads each
// rank's slice of the weights (shard on read).
//
//   tp::DistributedConfig dc{.tp_size = 4};   // tp_plan = "auto"
//   auto model = tp::AutoModelForCausalLM::from_pretrained(dir, {.dtype = tp::DType::BF16,
//                                                               .distributed_config = dc});
//   std::cout << model.tp_plan();
//   tp::Tensor logits = model.forward(input_ids);   // full logits on every rank
#include <filesystem>
#include <iosfwd>
#include <memory>
#include <optional>

#include "tp/distributed/device_mesh.h"
#include "tp/models/causal_lm.h"
#include "tp/parallel/plan.h"

namespace tp {

using parallel::DistributedConfig;

struct LoadOptions {
  std::optional<DType> dtype;  // matrices' dtype; unset: config.json's torch_dtype (f32 or bf16)
  DistributedConfig distributed_config;
  bool verbose = true;          // rank 0 prints warnings
  bool inference_only = true;   // release unpacked weights after packing (no gradients then)
  bool pack_weights = true;     // pack matrices for inference GEMMs (training updates them in place: no)
  // The mesh to load onto; styles use its "tp" dim (and "ep" with ep_size > 1). Unset:
  // make_model_mesh (a 1-D "tp" mesh of every rank of the world when ep_size is 1).
  std::shared_ptr<const dist::DeviceMesh> mesh;

  // What training wants: f32 weights (the optimizer's masters; bf16 compute copies
  // are made from them), plain tensors, nothing packed.
  static LoadOptions for_training(DistributedConfig dc = {}) {
    LoadOptions o;
    o.dtype = DType::F32;
    o.distributed_config = std::move(dc);
    o.inference_only = false;
    o.pack_weights = false;
    return o;
  }
};

// A tensor of the checkpoint a model was loaded from, as it was on disk.
struct SourceTensor {
  std::string name;
  DType dtype;
  Shape shape;
};

// A loaded model: the module tree with this rank's weights, its mesh and plan.
class PretrainedModel {
 public:
  CausalLM& lm() { return *lm_; }
  const ModelConfig& config() const { return lm_->config(); }
  const parallel::Plan& tp_plan() const { return resolved_.plan; }
  const parallel::ResolvedPlan& resolved_plan() const { return resolved_; }
  bool supports_tp_plan() const { return !lm_->shipped_plan().empty(); }
  const dist::DeviceMesh& mesh() const { return *mesh_; }
  int64_t tp_size() const { return mesh_->size("tp"); }
  int64_t ep_size() const { return mesh_->has_dim("ep") ? mesh_->size("ep") : 1; }
  int tp_rank() const { return mesh_->coordinate("tp"); }
  // Activations between blocks are sequence shards (DistributedConfig::enable_sequence_parallel).
  bool sequence_parallel() const { return resolved_.sequence_parallel; }

  // ids [B, T] or [T] -> logits [B, T, V] (f32, full vocabulary on every rank). No grad.
  Tensor forward(const Tensor& ids);
  // The same as `options` ask (a KV cache, some positions, vocab-parallel logits). No grad.
  CausalLMOutput forward(const Tensor& ids, const ForwardOptions& options);

  // Where the weights came from: save_pretrained writes the same names, dtypes and files.
  const std::filesystem::path& source_dir() const { return source_dir_; }
  const std::vector<SourceTensor>& source_tensors() const { return source_tensors_; }

  // Whether a forward may ask for vocab-parallel logits (ForwardOptions::sharded_logits):
  // lm_head is column-parallel (colwise_gather_output / colwise_rep / colwise), or there is one rank.
  bool can_shard_logits() const { return lm_->can_shard_logits(); }

 private:
  friend class AutoModelForCausalLM;
  std::unique_ptr<CausalLM> lm_;
  std::shared_ptr<const dist::DeviceMesh> mesh_;
  parallel::ResolvedPlan resolved_;
  parallel::StyleOverrides overrides_;  // modules point at these styles: they live as long as the model
  std::filesystem::path source_dir_;
  std::vector<SourceTensor> source_tensors_;
  std::shared_ptr<const nn::TensorParallelLayer> sharded_head_style_;  // its sequence-parallel colwise
  nn::Module* lm_head_module() const;
  void set_up_vocab_parallel_head();
};

class AutoModelForCausalLM {
 public:
  // from_config and from_pretrained check first that the module tree fits (see
  // check_module_tree_fits); from_pretrained checks the config against the weights.
  static PretrainedModel from_pretrained(const std::filesystem::path& dir, const LoadOptions& options = {});
  // The module tree of `config` without weights (for `tp plan` and tests).
  static std::unique_ptr<CausalLM> from_config(const ModelConfig& config);
  static std::vector<std::string> supported_model_types();
};

// The tp_size a DistributedConfig asks for in a world of `world_size` ranks (errors name both).
// With ep_size > 1 the world must be ep_size ranks; tp_size is then checked by the ep plan's rules.
int64_t resolve_tp_size(const DistributedConfig& dc, int64_t world_size);
// The mesh a model loads onto: {"tp"}, or with ep_size > 1 {"ep_replicas", "tp"} plus
// their flattening "ep" (every rank). Collective over the world.
std::shared_ptr<const dist::DeviceMesh> make_model_mesh(int64_t tp_size, int64_t ep_size);
// Resolves `dc`'s plan over `model` for `tp_size` ranks: style names, user keys,
// precedence, warnings, and the model's size checks — all before any weight is read.
parallel::ResolvedPlan resolve_model_plan(const CausalLM& model, const DistributedConfig& dc, int64_t tp_size,
                                          parallel::StyleOverrides* overrides);
// Every parameter of the tree as the plan resolver sees it.
std::vector<parallel::ParamRef> param_refs(CausalLM& model);

}  // namespace tp
