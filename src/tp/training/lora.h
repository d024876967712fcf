#pragma once
// LoRA adapters on a tensor-parallel model, laid out as PEFT lays them out under
// TP. Each targeted Linear W [out, in] gains children lora_A [r, in] and lora_B
// [out, r] (the PEFT key of lora_A is base_model.model.<module>.lora_A.weight)
// and computes y = x W^T + b + scaling * dropout(x) A^T B^T, scaling = alpha / r
// (rsLoRA: alpha / sqrt(r)). A targeted Embedding W [V, H] gains parameters
// lora_embedding_A [r, V] and lora_embedding_B [H, r] and adds scaling *
// A^T[ids] B^T (no dropout, as PEFT). Sharding follows the base weight:
//   column-parallel base (W split by rows): lora_B split the same way, lora_A
//     replicated; its partial gradients (each rank sees its output slice) are
//     summed over the tp ranks;
//   row-parallel base (W split by columns, x sharded): lora_A split the same way,
//     lora_B replicated; rank r adds B (A_r x_r), a partial sum the base's
//     all-reduce completes, and B's partial gradients are summed over the ranks;
//   an embedding split by vocabulary rows / by columns: as row- / column-parallel;
//   replicated base: both replicated.
// Generally, under a split base: the ranks that hold the same slice of a factor
// sum its gradient (KV heads held by several ranks included). Dropout masks are a function of
// (seed, step, call, global element index), so every tp rank draws the same
// mask and tp = N draws tp = 1's.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tp/models/auto.h"
#include "tp/nn/layers.h"
#include "tp/training/lora_config.h"

namespace tp::training {

class LoraAdapter;

struct AdaptedModule {
  nn::Module* base;
  nn::Parameter* base_weight;
  nn::Parameter* A;  // lora_A.weight [r, in] or lora_embedding_A [r, V]
  nn::Parameter* B;  // lora_B.weight [out, r] or lora_embedding_B [H, r]
  LoraAdapter* adapter;
};

// The adapters attached to one model (they live in its module tree).
class LoraModel {
 public:
  const LoraConfig& config() const { return config_; }
  const std::vector<AdaptedModule>& adapted() const { return adapted_; }
  // lora_A / lora_B weights and lora_embedding_A / _B: what a Trainer trains.
  static bool is_adapter_parameter(const std::string& name);
  // PEFT's key of an adapter parameter (base_model.model.<name>) and back.
  static std::string peft_key(const std::string& parameter_name);
  // Dropout masks are keyed by the optimizer step (so a resumed run draws the
  // same ones); the call counter restarts at every step.
  // `first_row`: where this rank's rows (tokens) start in the step's global
  // micro-batch, so data-parallel ranks draw the masks one rank with the whole
  // batch would.
  void begin_step(int64_t global_step, int64_t first_row = 0);
  // y += scaling * B A x in the base weights (this rank's slices), and the
  // adapters detached: the model computes as the merged checkpoint does.
  void merge_into_base();

 private:
  friend LoraModel apply_lora(PretrainedModel&, const LoraConfig&, const std::function<Tensor(const nn::Parameter&)>&);
  LoraConfig config_;
  std::vector<AdaptedModule> adapted_;
};

// Initial values as PEFT's init_lora_weights=True: lora_A Kaiming-uniform with
// a = sqrt(5) (uniform in +-1/sqrt(in_features)), lora_B zeros; for embeddings
// lora_embedding_A zeros and lora_embedding_B standard normal. A function of
// (seed, name, element), so every tp size draws the same tensor.
std::function<Tensor(const nn::Parameter&)> peft_init(uint64_t seed);

// Attaches adapters to every Linear and Embedding the config targets. `values` gives each
// adapter parameter's full tensor (f32, global shape), from which each rank keeps
// its slice. Errors name a target that matches no module and a base whose
// style has no LoRA layout. Collective over the model's tp group.
LoraModel apply_lora(PretrainedModel& model, const LoraConfig& config,
                     const std::function<Tensor(const nn::Parameter&)>& values);

}  // namespace tp::training
