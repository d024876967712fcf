#include "tp/nn/layers.h"

#include "tp/autograd/tape.h"
#include "tp/nn/decode_rows.h"
#include "tp/ops/embedding.h"
#include "tp/ops/norm.h"

namespace tp::nn {

namespace {
const Tensor& single_input(const std::vector<Tensor>& inputs, const std::string& module) {
  TP_CHECK(inputs.size() == 1, "{} takes one input, got {}", module, inputs.size());
  return inputs[0];
}
}  // namespace

Linear::Linear(std::string name, int64_t in_features, int64_t out_features, bool has_bias)
    : Module(std::move(name)), weight(add_parameter("weight", {out_features, in_features})) {
  if (has_bias) bias = &add_parameter("bias", {out_features}, ParamInit::Zeros);
}

DType Linear::weight_dtype() const {
  if (quantized_.defined() || packed_valid_) return packed_dtype_;
  return weight.data.defined() ? weight.data.dtype() : DType::F32;
}

void Linear::mark_fused(DType packed_dtype) {
  fused_ = true;
  packed_dtype_ = packed_dtype;
}

void Linear::set_quantized(ops::QuantizedLinear w, DType model_dtype) {
  quantized_ = std::move(w);
  packed_dtype_ = model_dtype;
  weight.data = Tensor();
}

void Linear::finalize_weights(bool inference_only) {
  if (quantized_.defined()) return;  // nothing to pack: the products read the codes
  bool shared = weight.data.impl_ptr().use_count() > 1;
  if (!fused_) {
    packed_ = ops::PackedLinear(weight.data, /*keep_weight=*/!inference_only || shared);
    packed_dtype_ = packed_.dtype();
  }
  if (inference_only && !shared) weight.data = Tensor();
  packed_valid_ = true;
}

void Linear::release_packed_weights() {
  packed_ = ops::PackedLinear();
  packed_valid_ = false;
  fused_ = false;
}

Tensor Linear::forward(const std::vector<Tensor>& inputs) {
  const Tensor& x = single_input(inputs, name());
  Tensor y = base_forward(x);
  return adapter_ ? adapter_->forward(x, y) : y;
}

Tensor Linear::base_forward(const Tensor& x) {
  Tensor b = (bias != nullptr && add_bias_in_forward) ? bias->data : Tensor();
  if (quantized_.defined()) {
    // The weight is frozen: gradients flow to x only (LoRA over a quantized base), never to it or its bias.
    TP_CHECK(!autograd::needs_grad({b}),
             "{}: its weight is quantized ({}-bit codes) and frozen: its bias cannot be trained either", name(),
             quantized_.bits());
    // Prefill (and the backward) compute as the model's other Linears do: in bf16 for a bf16 model or step.
    const bool bf16 = packed_dtype_ == DType::BF16 || compute_dtype == DType::BF16;
    // Decode steps' rows take decode's kernels however many share the product (nn/decode_rows.h).
    const int64_t rows = x.size(-1) == 0 ? 0 : x.numel() / x.size(-1);
    return ops::linear(x.dtype() == DType::BF16 ? x.to(DType::F32) : x, quantized_, b,
                       bf16 ? DType::BF16 : DType::F32, DecodeRows::for_rows(rows));
  }
  TP_CHECK(!fused_ || weight.data.defined(),
           "{}: its packed weight lives in its parent's fused GEMM (nn::FusedLinears); "
           "call the parent, or load the model with inference_only = false",
           name());
  const bool packed = packed_valid_ && !fused_ && !autograd::needs_grad({x, weight.data, b});
  if (packed && (x.dtype() != DType::BF16 || takes_bf16_input())) return ops::linear(x, packed_, b);
  const Tensor xf = x.dtype() == DType::BF16 ? x.to(DType::F32) : x;
  if (packed) return ops::linear(xf, packed_, b);
  TP_CHECK(weight.data.defined(),
           "{}: the weight was released after packing for inference; load the model with "
           "inference_only = false to compute gradients",
           name());
  return ops::linear(xf, weight.data, b, compute_dtype);
}

Embedding::Embedding(std::string name, int64_t num_embeddings, int64_t dim)
    : Module(std::move(name)), weight(add_parameter("weight", {num_embeddings, dim})) {}

Tensor Embedding::forward(const std::vector<Tensor>& inputs) {
  const Tensor& ids = single_input(inputs, name());
  Tensor y = ops::embedding(ids, weight.data, vocab_start);
  return adapter_ ? adapter_->forward(ids, y) : y;
}

RMSNorm::RMSNorm(std::string name, int64_t dim, double eps_, double weight_offset_)
    : Module(std::move(name)),
      weight(add_parameter("weight", {dim}, weight_offset_ == 0.0 ? ParamInit::Ones : ParamInit::Zeros)),
      eps(eps_),
      weight_offset(weight_offset_) {
  TP_CHECK(weight_offset == 0.0 || weight_offset == 1.0, "{}: weight_offset must be 0 (w) or 1 (1 + w), got {}",
           this->name(), weight_offset);
}

Tensor RMSNorm::forward(const std::vector<Tensor>& inputs) {
  return ops::rms_norm(single_input(inputs, name()), weight.data, eps, weight_offset);
}

}  // namespace tp::nn
