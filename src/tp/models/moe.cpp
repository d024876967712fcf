#include "tp/models/moe.h"

#include <algorithm>

#include "tp/models/deepseek_config.h"
#include "tp/ops/elementwise.h"
#include "tp/ops/shape.h"

namespace tp {

SparseMoeBlock::SparseMoeBlock(const std::string& name, const ModelConfig& c, const MoeConfig& moe)
    : nn::Module(name),
      gate(add_module(std::make_unique<nn::TopKRouter>(child_name(moe.router_name), c.hidden_size, moe.num_experts,
                                                       moe.scoring, moe.score_correction_bias,
                                                       /*linear_bias=*/moe.gpt_oss))),
      experts(add_module(std::make_unique<nn::MoeExperts>(
          child_name("experts"), moe.num_experts, c.hidden_size, moe.expert_intermediate, moe.top_k,
          // alpha is fixed in Transformers' GPT-OSS experts (1.702); the limit is config.json's swiglu_limit.
          nn::ExpertLayout{.gpt_oss = moe.gpt_oss, .swiglu_limit = static_cast<float>(moe.swiglu_limit)}))) {
  if (moe.shared_intermediate > 0)
    shared_experts =
        &add_module(std::make_unique<LlamaMLP>(child_name("shared_experts"), c, moe.shared_intermediate));
  moe_ = moe;
}

Tensor SparseMoeBlock::run(const Tensor& x, const nn::ForwardArgs* args) {  // [B, T, H]
  const Tensor flat = ops::reshape(x.dtype() == DType::F32 ? x : ops::to_dtype(x, DType::F32), {-1, x.size(-1)});
  const nn::Routing routing = gate.route(flat, args);
  Tensor out = ops::reshape(experts.call({flat, routing.weights, routing.ids}), x.shape());
  return shared_experts == nullptr ? out : ops::add(out, (*shared_experts)(x));
}

Tensor SparseMoeBlock::forward(const std::vector<Tensor>& inputs) { return run(inputs.at(0), nullptr); }

Tensor SparseMoeBlock::forward_with(const std::vector<Tensor>& inputs, const nn::ForwardArgs& args) {
  return run(inputs.at(0), &args);
}

}  // namespace tp
