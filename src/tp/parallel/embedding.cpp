#include "tp/parallel/embedding.h"

#include "tp/distributed/functional.h"
#include "tp/parallel/style_util.h"

namespace tp::parallel {

nn::ParamShard EmbeddingRowwise::shard_param(const nn::Module& module, const std::string& param_name,
                                         const Shape& global_shape, const nn::TpRank& tp) const {
  return shard_for(dist::Shard{0}, global_shape, tp);
}

void EmbeddingRowwise::install_forward(nn::Module& module, const nn::TpRank& tp) const {
  nn::Embedding& emb = as_embedding(module, "embedding_rowwise");
  emb.vocab_start = chunk_span(emb.weight.global_shape[0], tp.size, tp.rank).offset;
}

Tensor EmbeddingRowwise::transform_output_post_forward(nn::Module& module, Tensor output,
                                                       const dist::DeviceMesh& mesh) const {
  if (sequence_parallel_) return dist::reduce_scatter_to_region(output, 1, mesh.group("tp"));
  return dist::reduce_from_region(output, mesh.group("tp"));
}

std::vector<nn::CollectiveCost> EmbeddingRowwise::forward_collectives(const nn::Module& module,
                                                                  const nn::TpRank& tp) const {
  return {{sequence_parallel_ ? "reduce_scatter" : "all_reduce", output_features(module) * 4}};
}

std::shared_ptr<const nn::TensorParallelLayer> EmbeddingRowwise::sequence_parallel_variant(const nn::Module& module) const {
  return sequence_parallel_ ? nullptr : std::make_shared<EmbeddingRowwise>(true);
}

nn::ParamShard EmbeddingColwise::shard_param(const nn::Module& module, const std::string& param_name,
                                         const Shape& global_shape, const nn::TpRank& tp) const {
  return shard_for(dist::Shard{1}, global_shape, tp);
}

Tensor EmbeddingColwise::transform_output_post_forward(nn::Module& module, Tensor output,
                                                       const dist::DeviceMesh& mesh) const {
  return dist::gather_from_region(output, -1, mesh.group("tp"));
}

std::vector<nn::CollectiveCost> EmbeddingColwise::forward_collectives(const nn::Module& module,
                                                                  const nn::TpRank& tp) const {
  return {{"all_gather", output_features(module) * 4}};
}

std::shared_ptr<const nn::TensorParallelLayer> EmbeddingColwise::sequence_parallel_variant(const nn::Module& module) const {
  fail("'{}' is embedding_colwise, which has no sequence-parallel form yet; use embedding_rowwise (vocab-parallel) "
       "or no style for it, or turn sequence parallelism off", module.name());
}

}  // namespace tp::parallel
