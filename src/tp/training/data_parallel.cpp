#include "tp/training/data_parallel.h"

#include <cstring>

namespace tp::training {

namespace {

using Clock = std::chrono::steady_clock;

// Adds the time its scope took to `total`.
class Timed {
 public:
  explicit Timed(double& total) : total_(total), start_(Clock::now()) {}
  ~Timed() { total_ += std::chrono::duration<double>(Clock::now() - start_).count(); }

 private:
  double& total_;
  Clock::time_point start_;
};

}  // namespace

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
    bucket_of_[ps[i].compute.impl()] = buckets_.size() - 1;
  }
  // Rank k of the shard group owns the k-th chunk of every bucket.
  std::vector<SlabRange> owned;
  int64_t scratch = 0;
  for (Bucket& b : buckets_) {
    b.owned = chunk_span(b.end - b.begin, shard_.size(), shard_.rank());
    b.scratch = scratch;
    scratch += b.owned.size;
    if (b.owned.size > 0) owned.push_back({b.begin + b.owned.offset, b.begin + b.owned.offset + b.owned.size});
  }
  if (shard_.size() > 1) {
    params_.shard_updates(shard_, owned);
    scratch_ = Tensor::zeros({std::max<int64_t>(scratch, 1)});
  }
}

GradientReducer::~GradientReducer() {
  // A step that failed midway: collectives in flight must finish before their buffers go.
  for (Bucket& b : buckets_) b.work.reset();
}

std::unique_ptr<autograd::LeafGradReadyHook> GradientReducer::watch_backward() {
  for (Bucket& b : buckets_) {
    b.pending = b.params;
    b.ready = false;
    b.work.reset();
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
  // Let MPI move the collectives in flight along (it progresses only inside MPI calls).
  for (int64_t i = static_cast<int64_t>(buckets_.size()) - 1; i > next_launch_; --i)
    if (buckets_[i].work) buckets_[i].work->test();
}

void GradientReducer::launch_ready() {
  while (next_launch_ >= 0 && buckets_[next_launch_].ready) launch(buckets_[next_launch_--]);
}

Tensor GradientReducer::owned_grad(const Bucket& b) const {
  return params_.grad_slab().narrow(0, b.begin + b.owned.offset, b.owned.size);
}

void GradientReducer::launch(Bucket& b) {
  Timed timed(comm_seconds_);
  Tensor grads = params_.grad_slab().narrow(0, b.begin, b.end - b.begin);
  if (shard_.size() > 1)
    b.work = shard_.reduce_scatter_async(grads, scratch_.narrow(0, b.scratch, b.owned.size));
  else
    b.work = replicate_.all_reduce_async(grads);
}

void GradientReducer::finish() {
  for (Bucket& b : buckets_) b.ready = true;  // parameters the backward did not reach have their gradients too
  launch_ready();
  Timed timed(comm_seconds_);
  for (int64_t i = static_cast<int64_t>(buckets_.size()) - 1; i >= 0; --i) {
    Bucket& b = buckets_[i];
    b.work->wait();
    b.work.reset();
    if (shard_.size() == 1) continue;
    // The summed chunk goes back to its place in the gradient slab, then replicas add theirs.
    Tensor mine = owned_grad(b);
    if (b.owned.size > 0)
      std::memcpy(mine.raw_data(), scratch_.data<float>() + b.scratch, static_cast<size_t>(b.owned.size) * 4);
    if (replicate_.size() > 1) b.work = replicate_.all_reduce_async(mine);
  }
  for (Bucket& b : buckets_)
    if (b.work) {
      b.work->wait();
      b.work.reset();
    }
}

void GradientReducer::gather_updated_weights() {
  if (shard_.size() == 1) return;
  {
    Timed timed(comm_seconds_);
    for (const Bucket& b : buckets_) shard_.all_gather_in_place(params_.master_slab().narrow(0, b.begin, b.end - b.begin));
  }
  // The chunks other ranks updated reach the bf16 compute copies too (this rank's own did in the update).
  params_.refresh_compute_weights();
}

double GradientReducer::take_communication_seconds() {
  const double s = comm_seconds_;
  comm_seconds_ = 0;
  return s;
}

}  // namespace tp::training
