#pragma once
#include <cstdint>

#include "tp/nn/parallel_layer.h"

namespace tp::parallel {

// mla_kv_a_proj: DeepSeek's kv_a_proj_with_mqa, replicated on every rank. Its
// output [..., kv_lora_rank + qk_rope_head_dim] is the compressed latent, which
// enters kv_b_proj (colwise: that style all-reduces its input gradient), and the
// k_pe shared by all heads, which goes straight into this rank's heads'
// attention, so its gradient holds this rank's heads only:
//   fwd: identity    bwd: all-reduce the gradient of the last qk_rope_head_dim outputs
class MlaKvAProjParallel : public nn::TensorParallelLayer {
 public:
  struct Options {
    int64_t qk_rope_head_dim = 0;  // from the model config; 0: the config has none (an error at load)
  };
  MlaKvAProjParallel() : MlaKvAProjParallel(Options{}) {}
  explicit MlaKvAProjParallel(Options options) : options_(options) {}

  void validate_param(const nn::Module& module, const std::string& param_name, const Shape& global_shape,
                      const nn::TpRank& tp) const override;
  Tensor transform_output_post_forward(nn::Module& module, Tensor output, const dist::DeviceMesh& mesh) const override;

 private:
  Options options_;
};

}  // namespace tp::parallel
