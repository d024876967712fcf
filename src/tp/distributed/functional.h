#pragma once
// Differentiable collectives on plain local tensors (Megatron-style regions),
// for the tensor-parallel styles' fast path. Each op records one autograd entry
// when its input needs a gradient; a group of size 1 runs the same code.
// Pieces along `dim` follow torch.chunk's rule (tp::chunk_span). The backward
// closures keep a reference to `g`: the group (e.g. its DeviceMesh) must outlive
// the backward pass.
#include "tp/distributed/process_group.h"

namespace tp::dist {

// fwd: identity / bwd: all-reduce(sum)
Tensor copy_to_region(const Tensor& x, ProcessGroup& g);
// fwd: all-reduce(sum) / bwd: identity
Tensor reduce_from_region(const Tensor& x, ProcessGroup& g);
// fwd: all-gather(dim), uneven sizes ok / bwd: keep this rank's slice
Tensor gather_from_region(const Tensor& x, int64_t dim, ProcessGroup& g);
// fwd: keep this rank's chunk of dim / bwd: all-gather(dim)
Tensor scatter_to_region(const Tensor& x, int64_t dim, ProcessGroup& g);
// fwd: reduce-scatter(dim) / bwd: all-gather(dim)
Tensor reduce_scatter_to_region(const Tensor& x, int64_t dim, ProcessGroup& g);
// fwd: all-gather(dim), uneven sizes ok / bwd: reduce-scatter(dim) back to each rank's slice
Tensor all_gather_to_region(const Tensor& x, int64_t dim, ProcessGroup& g);
// fwd: rows [.., + send_counts[j]) of x (dim 0) go to rank j (all_to_all_v); `recv_counts`
// gets how many rows came from each rank / bwd: the reverse exchange of the rows' gradients
Tensor all_to_all_rows(const Tensor& x, const std::vector<int64_t>& send_counts, ProcessGroup& g,
                       std::vector<int64_t>* recv_counts = nullptr);
// In place: sums a replicated parameter's gradient over the group (parameters
// replicated across ranks whose per-rank gradients are partial sums).
void all_reduce_grad(Tensor& param_grad, ProcessGroup& g);

}  // namespace tp::dist
