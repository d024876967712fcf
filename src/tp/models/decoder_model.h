#pragma once
// The body every decoder-only architecture shares: embed_tokens, the decoder
// layers, the final norm, in checkpoint order. Layer is the architecture's
// decoder layer, built as Layer(name, index, config, extra) where Extra is what
// else it needs (LlamaVariant, DeepseekSizes).
#include <memory>
#include <string>
#include <vector>

#include "tp/autograd/checkpoint.h"
#include "tp/models/config.h"
#include "tp/models/decoder_args.h"
#include "tp/models/gradient_checkpointing.h"
#include "tp/models/unit_hooks.h"
#include "tp/nn/layers.h"
#include "tp/nn/moe.h"
#include "tp/ops/elementwise.h"

namespace tp {

// What an architecture changes in the shared body (Gemma: both).
struct DecoderBodyOptions {
  // embed_tokens' output times this, the factor first rounded to the weights'
  // dtype as Transformers' Gemma does (sqrt(hidden_size) in bf16 for bf16 weights).
  double embed_scale = 1.0;
  double norm_weight_offset = 0.0;  // the final norm's (nn::RMSNorm)
};

template <class Layer, class Extra>
class DecoderModel : public nn::Module {
 public:
  DecoderModel(const std::string& name, const ModelConfig& c, const Extra& extra, const DecoderBodyOptions& body = {})
      : nn::Module(name),
        embed_tokens(
            add_module(std::make_unique<nn::Embedding>(child_name("embed_tokens"), c.vocab_size, c.hidden_size))),
        norm(add_layers_then_norm(c, extra, body.norm_weight_offset)),
        embed_scale_(body.embed_scale) {}
  nn::Embedding& embed_tokens;
  std::vector<Layer*> layers;
  nn::RMSNorm& norm;
  // Which layers run checkpointed (set by the CausalLM that owns this model).
  const GradientCheckpointing* checkpointing = nullptr;
  // Parameter units' hooks (FSDP), read at each forward from the owner's slot.
  UnitHooks* const* unit_hooks = nullptr;

 protected:
  Tensor forward(const std::vector<Tensor>& inputs) override {
    fail("{}: the decoder runs with its DecoderArgs (positions, cache), from the model's run_decoder", name());
  }
  Tensor forward_with(const std::vector<Tensor>& inputs, const nn::ForwardArgs& args_in) override {
    const DecoderArgs& args = decoder_args(args_in, *this);  // ids [B, T] -> hidden [B, T, H]
    UnitHooks* hooks = unit_hooks != nullptr ? *unit_hooks : nullptr;
    if (hooks != nullptr) hooks->begin_forward();
    Tensor h = embed_tokens(inputs.at(0));
    if (embed_scale_ != 1.0) {
      const Tensor& w = embed_tokens.weight.data;  // FSDP may hold it only inside the call
      h = ops::scale(h, scale_in_dtype(embed_scale_, w.defined() ? w.dtype() : h.dtype()));
    }
    if (hooks != nullptr) h = hooks->leave_embedding(h);
    for (size_t i = 0; i < layers.size(); ++i) {
      const auto layer = static_cast<int64_t>(i);
      if (hooks != nullptr) h = hooks->enter_layer(layer, h);
      h = checkpointing != nullptr && checkpointing->applies(layer) ? checkpointed(*layers[i], h, args)
                                                                    : layers[i]->call({h}, &args);
      if (hooks != nullptr) h = hooks->leave_layer(layer, h);
    }
    if (hooks != nullptr) h = hooks->enter_head(h);
    return norm(h);
  }

 private:
  // The layer's forward runs again inside the backward, after this call has
  // returned: the block keeps its own copy of the arguments, and the routers'
  // logits (as many each time) are outputs of the checkpoint, so that the
  // backward reaches the ones the loss used.
  Tensor checkpointed(Layer& layer, const Tensor& h, const DecoderArgs& args) {
    std::vector<Tensor> params;
    for (nn::Parameter* p : layer.parameters())
      if (p->data.defined() && p->data.requires_grad()) params.push_back(p->data);
    DecoderArgs own = args;
    own.router_logits = nullptr;
    auto block = [&layer, own](const std::vector<Tensor>& in) {
      std::vector<Tensor> router_logits;
      DecoderArgs call_args = own;
      call_args.router_logits = &router_logits;
      std::vector<Tensor> out{layer.call({in[0]}, &call_args)};
      out.insert(out.end(), router_logits.begin(), router_logits.end());
      return out;
    };
    std::vector<Tensor> out = autograd::checkpoint(block, {h}, params, checkpointing->policy);
    if (args.router_logits != nullptr) args.router_logits->insert(args.router_logits->end(), out.begin() + 1, out.end());
    return out[0];
  }

  // Registration order is checkpoint order: embed_tokens, layers.0 ..., norm.
  nn::RMSNorm& add_layers_then_norm(const ModelConfig& c, const Extra& extra, double norm_weight_offset) {
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      layers.push_back(&add_module(std::make_unique<Layer>(child_name("layers." + std::to_string(i)), i, c, extra)));
    return add_module(
        std::make_unique<nn::RMSNorm>(child_name("norm"), c.hidden_size, c.rms_norm_eps, norm_weight_offset));
  }
  static double scale_in_dtype(double s, DType dtype) {
    if (dtype == DType::BF16) return to_f32(to_bf16(static_cast<float>(s)));
    return s;
  }

  double embed_scale_;
};

}  // namespace tp
