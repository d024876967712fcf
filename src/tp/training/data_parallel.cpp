#include "tp/training/data_parallel.h"

namespace tp::training {

GradientReducer::GradientReducer(ModelParameters& params, dist::ProcessGroup& replicate, dist::ProcessGroup& shard,
                                 int64_t bucket_bytes)
    : params_(params), replicate_(replicate), shard_(shard) {
  TP_CHECK(bucket_bytes > 0, "the gradient bucket size must be positive, got {} bytes", bucket_bytes);
  const std::vector<TrainableParam>& ps = params_.params();
  const int64_t cap = std::max<int64_t>(1, bucket_bytes / static_cast<int64_t>(sizeof(float)));
  for (size_t i = 0; i < ps.size(); ++i) {
    const int64_t end = i + 1 < ps.size() ? ps[i + 1].offset : params_.numel();  // padding included
    const bool boundary = ps[i].offset == params_.replicated_numel() && ps[i].offset > 0;
    if (buckets_.empty() || boundary || buckets_.back().end - buckets_.back().begin >= cap)
      buckets_.push_back({ps[i].offset, ps[i].offset});
    Bucket& b = buckets_.back();
    b.end = end;
    ++b.params;
  }
  // Rank k of the shard group owns the k-th chunk of every bucket (ModelParameters' rule).
  if (shard_.size() > 1) {
    std::vector<SlabRange> ranges;
    for (const Bucket& b : buckets_) ranges.push_back({b.begin, b.end});
    params_.shard_updates(shard_, ranges);
  }
  for (size_t i = 0; i < buckets_.size(); ++i)
    buckets_[i].owned = shard_.size() > 1 ? params_.owned_chunk(i) : ChunkSpan{0, buckets_[i].end - buckets_[i].begin};
  // After sharding: sharded masters move the vectors' compute tensors.
  for (size_t i = 0, b = 0; i < ps.size(); ++i) {
    while (b + 1 < buckets_.size() && buckets_[b + 1].begin <= ps[i].offset) ++b;
    bucket_of_[ps[i].compute.impl()] = b;
  }
  comm_clock_ = replicate_.collective_seconds() + shard_.collective_seconds();
}

std::unique_ptr<autograd::LeafGradReadyHook> GradientReducer::watch_backward() {
  for (Bucket& b : buckets_) {
    b.pending = b.params;
    b.ready = false;
  }
  next_launch_ = static_cast<int64_t>(buckets_.size()) - 1;
  launched_during_backward_ = 0;
  return std::make_unique<autograd::LeafGradReadyHook>([this](const TensorImpl* leaf) { on_ready(leaf); });
}

void GradientReducer::on_ready(const TensorImpl* leaf) {
  auto it = bucket_of_.find(leaf);
  if (it == bucket_of_.end()) return;  // not a trained parameter (an input, a frozen weight)
  Bucket& b = buckets_[it->second];
  if (--b.pending == 0) b.ready = true;
  const int64_t before = next_launch_;
  launch_ready();
  launched_during_backward_ += before - next_launch_;
}

void GradientReducer::launch_ready() {
  while (next_launch_ >= 0 && buckets_[next_launch_].ready) reduce(buckets_[next_launch_--]);
}

void GradientReducer::reduce(const Bucket& b) {
  Tensor grads = params_.grad_slab().narrow(0, b.begin, b.end - b.begin);
  if (shard_.size() == 1) {
    replicate_.all_reduce(grads);
    return;
  }
  // The reduce-scatter's result, as an all-reduce of which this rank keeps (and
  // then reads) only its chunk; replicas of the chunk then add theirs.
  shard_.all_reduce(grads);
  if (replicate_.size() > 1) {
    Tensor mine = grads.narrow(0, b.owned.offset, b.owned.size);
    replicate_.all_reduce(mine);
  }
}

void GradientReducer::finish() {
  for (Bucket& b : buckets_) b.ready = true;  // parameters the backward did not reach have their gradients too
  launch_ready();
}

void GradientReducer::gather_updated_weights() {
  if (shard_.size() == 1) return;
  params_.gather_updated_weights();
}

double GradientReducer::take_communication_seconds() {
  // The groups' own clocks: every dp collective runs on one of the two.
  const double now = replicate_.collective_seconds() + shard_.collective_seconds();
  const double s = now - comm_clock_;
  comm_clock_ = now;
  return s;
}

}  // namespace tp::training
