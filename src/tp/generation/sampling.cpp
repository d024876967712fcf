#include "tp/generation/sampling.h"

#include "tp/ops/shape.h"

namespace tp::generation {

std::vector<int64_t> vocab_parallel_argmax(const Tensor& logits, int64_t vocab_start, dist::ProcessGroup& group,
                                           int64_t* rank0_flag) {
  // Per row: the logit's bits and its id (-1: this rank holds none of the row); then the flag.
  const int64_t B = logits.size(0), width = 2 * B + 1;
  const Tensor candidates = ops::argmax_candidates(logits, vocab_start, group.rank() == 0);
  const Tensor flag =
      Tensor::from_ints({rank0_flag != nullptr && group.rank() == 0 ? *rank0_flag : 0}, {1}, DType::I64);
  const Tensor all = ops::reshape(group.all_gather(ops::cat({ops::reshape(candidates, {2 * B}), flag}, 0), 0),
                                  {group.size(), width});
  if (rank0_flag != nullptr) *rank0_flag = ops::narrow(all, 1, 2 * B, 1).to_int_vector().front();
  return ops::best_candidates(ops::reshape(ops::narrow(all, 1, 0, 2 * B), {group.size(), B, 2})).to_int_vector();
}

}  // namespace tp::generation
