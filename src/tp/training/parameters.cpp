#include "tp/training/parameters.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <map>
#include <regex>
#include <tuple>

#include "tp/core/parallel_for.h"
#include "tp/nn/layers.h"
#include "tp/nn/moe.h"
#include "tp/ops/bf16_rounding.h"
#include "tp/ops/elementwise.h"
#include "tp/ops/gemm.h"
#include "tp/ops/sum_squares.h"
#include "tp/parallel/shards.h"

namespace tp::training {

bool decays(const std::string& name) {
  static const std::regex no_decay(R"(bias|layernorm|rmsnorm|(?:^|\.)norm(?:$|\.)|_norm(?:$|\.))");
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return !std::regex_search(lower, no_decay);
}

namespace {

constexpr int64_t kAlign = 16;  // elements: each parameter starts on a 64-byte boundary of the slabs

// Under bf16 compute a matrix computes on a bf16 copy; vectors always on f32 masters.
bool computes_in_bf16(bool bf16, const Tensor& loaded) { return bf16 && loaded.dim() >= 2; }

Tensor view(const Tensor& slab, int64_t offset, const Shape& shape) {
  return Tensor::wrap(slab.storage(), slab.storage_offset() + static_cast<size_t>(offset) * dtype_size(slab.dtype()),
                      shape, slab.dtype());
}

// Elements [seg.begin, seg.end) of one parameter's tensor (a view).
Tensor segment_of(const Tensor& t, const OwnedSegment& seg) {
  return t.flatten().narrow(0, seg.begin, seg.end - seg.begin);
}

}  // namespace

ModelParameters::ModelParameters(nn::Module& model, dist::ProcessGroup& tp_group, bool bf16_compute,
                                 const std::function<bool(const std::string&)>& trainable,
                                 const ExpertParallelGroups& ep, const FullyShardOptions& fsdp,
                                 std::optional<bool> bf16_native_gemm)
    : group_(tp_group), ep_(ep), bf16_(bf16_compute), fsdp_(fsdp.enabled()) {
  TP_CHECK(!ep_.enabled() || ep_.replicas != nullptr, "ModelParameters: expert parallelism needs the ep_replicas group");
  TP_CHECK(!fsdp_ || !ep_.enabled(), "FSDP with expert parallelism is not supported: shard over dp_shard, or the "
           "experts over ep, not both");
  if (bf16_ && bf16_native_gemm) {
    bf16_native_ = *bf16_native_gemm;
  } else if (bf16_) {
    // Rank 0's measurement decides for all: ranks must run the same arithmetic.
    // Only rank 0 probes: ranks sharing cores would time each other's probes.
    Tensor native = Tensor::from_ints({group_.rank() == 0 && ops::detail::bf16_gemm_native() ? 1 : 0}, {1});
    group_.broadcast(native, 0);
    bf16_native_ = native.to_int_vector()[0] == 1;
  }
  std::map<const TensorImpl*, size_t> seen;  // tied parameters share one tensor
  // A frozen matrix computes in the step's precision too: under bf16, its bf16
  // values (rounded once; tied ones stay one tensor).
  std::map<const TensorImpl*, Tensor> frozen;
  auto freeze = [&](nn::Parameter& p) {
    if (!bf16_ || p.data.dim() < 2 || p.data.dtype() != DType::F32) return;
    auto [it, fresh] = frozen.try_emplace(p.data.impl());
    if (fresh) {
      if (bf16_native_) {
        it->second = p.data.to(DType::BF16);
      } else {
        it->second = Tensor::empty(p.data.shape());
        ops::round_to_bf16(p.data, it->second);
      }
    }
    p.data = it->second;
  };
  for (nn::Module* m : model.modules()) {
    if (auto* linear = dynamic_cast<nn::Linear*>(m); linear != nullptr && bf16_ && !bf16_native_)
      linear->compute_dtype = DType::BF16;
    const auto* experts = dynamic_cast<const nn::MoeExperts*>(m);
    const bool expert_sharded = ep_.enabled() && experts != nullptr && experts->experts_sharded();
    for (nn::Parameter* p : m->own_parameters()) {
      if (auto* linear = dynamic_cast<nn::Linear*>(m); linear != nullptr && p == &linear->weight &&
                                                       linear->quantized().defined()) {
        // Its codes stay packed and frozen (QLoRA): the step computes through them in its precision.
        TP_CHECK(trainable && !trainable(p->name),
                 "parameter '{}' is quantized ({}-bit codes): a quantized model cannot be fine-tuned itself; attach "
                 "trainable adapters on top of it (tp train --lora-r R, or training::apply_lora), which train over "
                 "the frozen codes",
                 p->name, linear->quantized().bits());
        if (bf16_) linear->compute_dtype = DType::BF16;
        continue;
      }
      TP_CHECK(p->data.defined(), "parameter '{}' has no data: load the model for training "
               "(LoadOptions::for_training(), which keeps the plain weights)", p->name);
      if (auto it = seen.find(p->data.impl()); it != seen.end()) {
        params_[it->second].refs.push_back(p);
        continue;
      }
      if (trainable && !trainable(p->name)) {
        freeze(*p);
        continue;
      }
      seen[p->data.impl()] = params_.size();
      TrainableParam t;
      t.name = p->name;
      t.index = static_cast<int64_t>(params_.size());
      t.refs = {p};
      t.global_shape = p->global_shape;
      t.decay = decays(p->name);
      t.expert_sharded = expert_sharded;
      dist::ProcessGroup& over = expert_sharded ? *ep_.ep : group_;
      t.shards = parallel::all_shards(p->shard, over);  // every rank walks the same tree in the same order
      t.replicated = p->shard.replicated();
      t.counted = parallel::first_holder(t.shards, over.rank()) == over.rank();
      params_.push_back(std::move(t));
    }
    // Training changes weights in place: a packed inference copy would go stale.
    m->release_packed_weights();
  }
  std::stable_partition(params_.begin(), params_.end(), [](const TrainableParam& p) { return !p.expert_sharded; });
  std::stable_partition(params_.begin(), params_.end(), [](const TrainableParam& p) { return p.replicated; });
  if (fsdp_) {
    for (TrainableParam& p : params_) {
      p.unit = fsdp.unit_of(p.name);
      p.grad_by_rows = p.unit < 0 && p.refs[0]->data.dim() == 2;
    }
    // Unit by unit (the root first); within one, the gradients by rows last,
    // tp-replicated before tp-sharded and vectors before matrices: each run is one
    // bucket, of one compute dtype, and as long on every tp rank as its replicated
    // runs need (sync_replicated_grads).
    auto key = [&](const TrainableParam& p) {
      return std::tuple(p.unit, p.grad_by_rows, !p.replicated, computes_in_bf16(bf16_, p.refs[0]->data));
    };
    std::stable_sort(params_.begin(), params_.end(),
                     [&](const TrainableParam& a, const TrainableParam& b) { return key(a) < key(b); });
  }

  for (TrainableParam& p : params_) {
    p.offset = numel_;
    numel_ += (p.refs[0]->data.numel() + kAlign - 1) / kAlign * kAlign;
    if (p.replicated) replicated_end_ = numel_;
    if (!p.expert_sharded) ep_replicated_end_ = numel_;
  }
  state_numel_ = numel_;
  for (TrainableParam& p : params_) p.owned = {{0, p.refs[0]->data.numel(), p.offset}};
  if (fsdp_) {
    // Straight from the loaded weights into this rank's chunks: no whole f32 slab
    // (four ranks on one machine would each hold the whole model twice).
    fully_shard(fsdp);
    return;
  }
  master_ = Tensor::zeros({numel_});
  grad_ = Tensor::zeros({numel_});
  if (bf16_ && fsdp.compute_by_unit_only())
    compute_by_unit(fsdp.unit_of);  // the matrices' compute tensors: views of their unit's buffer
  else if (bf16_)
    compute_copy_ = Tensor::zeros({numel_}, bf16_native_ ? DType::BF16 : DType::F32);
  for (TrainableParam& p : params_) {
    const Tensor& loaded = p.refs[0]->data;
    p.master = view(master_, p.offset, loaded.shape());
    p.master.copy_from(loaded);
    p.grad = view(grad_, p.offset, loaded.shape());
    if (!computes_in_bf16(bf16_, loaded))
      p.compute = p.master;
    else if (!computes_by_unit())
      p.compute = view(compute_copy_, p.offset, loaded.shape());
    p.compute.set_requires_grad(true);
    p.compute.set_grad(p.grad);
    for (nn::Parameter* ref : p.refs) ref->data = p.compute;
  }
  refresh_compute_weights();
}

void ModelParameters::compute_by_unit(const std::function<int64_t(const std::string&)>& unit_of) {
  // Units in id order (the root, -1, first), each matrix at a 64-byte boundary of its unit's buffer.
  const DType dtype = bf16_native_ ? DType::BF16 : DType::F32;
  std::map<int64_t, size_t> bytes;  // unit id -> its buffer's size so far
  std::vector<size_t> at(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    TrainableParam& p = params_[i];
    p.unit = unit_of(p.name);
    if (!computes_in_bf16(bf16_, p.refs[0]->data)) continue;  // a vector computes on its masters
    size_t& end = bytes[p.unit];
    at[i] = (end + 63) / 64 * 64;
    end = at[i] + static_cast<size_t>(p.refs[0]->data.numel()) * dtype_size(dtype);
  }
  std::map<int64_t, std::shared_ptr<Storage>> buffer;
  for (const auto& [id, size] : bytes) {
    units_.push_back({id, 0, 0, {}, 0, 0, Storage::allocate(size), nullptr, nullptr});
    buffer[id] = units_.back().compute;
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    TrainableParam& p = params_[i];
    if (computes_in_bf16(bf16_, p.refs[0]->data))
      p.compute = Tensor::wrap(buffer[p.unit], at[i], p.refs[0]->data.shape(), dtype);
  }
}

const TrainableParam& ModelParameters::find(const std::string& name) const {
  for (const TrainableParam& p : params_) {
    if (p.name == name) return p;
    for (const nn::Parameter* ref : p.refs)
      if (ref->name == name) return p;
  }
  fail("no trainable parameter named '{}'", name);
}

void ModelParameters::zero_grad() {
  (fsdp_ ? grad_shard_ : grad_).zero();
}

Tensor ModelParameters::owned_grad(const TrainableParam& p, const OwnedSegment& seg) const {
  if (fsdp_) return grad_shard_.narrow(0, seg.state, seg.end - seg.begin);
  return segment_of(p.grad, seg);
}

Tensor compute_copy_of(const TrainableParam& p, const OwnedSegment& seg) {
  return p.compute.is_same(p.master) ? Tensor() : segment_of(p.compute, seg);
}

namespace {

// Writes `masters`, p's masters of elements [begin, begin + masters.numel()), into
// its compute copy; nothing when they are one.
void round_into_compute_copy(const TrainableParam& p, const Tensor& masters, int64_t begin) {
  const Tensor compute = compute_copy_of(p, {begin, begin + masters.numel(), 0});
  if (compute.defined()) ops::round_to_bf16(masters, compute);
}

// All of p's masters into its compute copy, in blocks over the threads.
void round_whole_compute_copy(const TrainableParam& p) {
  const Tensor masters = p.master.flatten();
  const int64_t n = masters.numel(), block = 1 << 16;
  parallel_region(n > block, [&] {
#pragma omp for schedule(static)
    for (int64_t b = 0; b < n; b += block) round_into_compute_copy(p, masters.narrow(0, b, std::min(block, n - b)), b);
  });
}

}  // namespace

void ModelParameters::refresh_compute_weights() {
  if (computes_by_unit()) {  // a unit's weights are gathered from the masters when it runs next
    for (size_t u = 0; u < units_.size(); ++u) release_unit(u);
    return;
  }
  TP_CHECK(!masters_sharded_, "refresh_compute_weights: the masters are sharded (use gather_updated_weights)");
  for (TrainableParam& p : params_) round_whole_compute_copy(p);
}

void ModelParameters::sync_replicated_grads() {
  if (group_.size() == 1) return;
  if (fsdp_) {  // each replicated bucket's chunk: the same chunk on every tp rank of this dp coordinate
    for (size_t b = 0; b < buckets_.size(); ++b) {
      if (!layout_[b].replicated) continue;
      Tensor mine = grad_shard_.narrow(0, layout_[b].state, owned_chunk(b).size);
      group_.broadcast(mine, 0);
    }
    return;
  }
  if (replicated_end_ == 0) return;
  Tensor replicated = grad_.narrow(0, 0, replicated_end_);
  group_.broadcast(replicated, 0);
}

void ModelParameters::sync_ep_replicas() {
  if (!ep_.enabled() || ep_.replicas->size() == 1 || ep_replicated_end_ == 0) return;
  Tensor replicated = grad_.narrow(0, 0, ep_replicated_end_);
  ep_.replicas->broadcast(replicated, 0);
}

double sum_over_ranks(double value, dist::ProcessGroup& group) {
  // Every rank adds the same partial sums in the same order: the same bits everywhere.
  int64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  std::vector<int64_t> all = group.all_gather(Tensor::from_ints({bits}, {1}), 0).to_int_vector();
  double total = 0;
  for (int64_t b : all) {
    double part;
    std::memcpy(&part, &b, sizeof part);
    total += part;
  }
  return total;
}

double ModelParameters::global_grad_norm() const {
  double mine = 0, experts = 0;  // squares of the tp group's parameters, and of this rank's experts
  for (const TrainableParam& p : params_) {
    if (!p.counted) continue;
    double& into = p.expert_sharded ? experts : mine;
    for (const OwnedSegment& seg : p.owned) ops::accumulate_sum_squares(owned_grad(p, seg), into);
  }
  if (shard_group_ != nullptr) mine = sum_over_ranks(mine, *shard_group_);
  // Every replica's tp group holds the same gradients: its sum counts them once.
  double total = sum_over_ranks(mine, group_);
  if (ep_.enabled()) total += sum_over_ranks(experts, *ep_.ep);
  return std::sqrt(total);
}

void ModelParameters::shard_updates(dist::ProcessGroup& shard_group, const std::vector<SlabRange>& buckets) {
  TP_CHECK(shard_group_ == nullptr, "shard_updates: the updates are sharded already");
  // Its all-gather of the updated weights fills the whole compute copy.
  TP_CHECK(!computes_by_unit(), "shard_updates: the compute weights are held by unit (FullyShardOptions without a "
           "group); sharded updates need the whole compute copy");
  shard_group_ = &shard_group;
  buckets_ = buckets;
  assign_owned();
  if (bf16_) shard_masters();
}

void ModelParameters::assign_owned() {
  std::vector<SlabRange> owned;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const ChunkSpan c = owned_chunk(b);
    if (c.size > 0) owned.push_back({buckets_[b].begin + c.offset, buckets_[b].begin + c.offset + c.size});
  }
  state_numel_ = 0;
  size_t r = 0;
  for (TrainableParam& p : params_) {
    p.owned.clear();
    const int64_t begin = p.offset, end = p.offset + p.refs[0]->data.numel();
    while (r < owned.size() && owned[r].end <= begin) {
      state_numel_ += owned[r].end - owned[r].begin;
      ++r;
    }
    // Every owned range that overlaps this parameter, each at its place in the state.
    int64_t state = state_numel_;
    for (size_t k = r; k < owned.size() && owned[k].begin < end; ++k) {
      const int64_t lo = std::max(begin, owned[k].begin), hi = std::min(end, owned[k].end);
      if (lo < hi) p.owned.push_back({lo - p.offset, hi - p.offset, state + (lo - owned[k].begin)});
      state += owned[k].end - owned[k].begin;
    }
  }
  for (; r < owned.size(); ++r) state_numel_ += owned[r].end - owned[r].begin;
}

ChunkSpan ModelParameters::owned_chunk(size_t b) const {
  return chunk_span(buckets_[b].end - buckets_[b].begin, shard_group_->size(), shard_group_->rank());
}

// Under bf16 the matrices compute on their compute copies: their masters shrink
// to the owned elements. Vectors compute on their masters, so they move whole
// to a slab of their own and the full master slab goes.
void ModelParameters::shard_masters() {
  int64_t vectors = 0;
  for (const TrainableParam& p : params_)
    if (p.compute.is_same(p.master)) vectors += (p.grad.numel() + kAlign - 1) / kAlign * kAlign;
  vector_slab_ = Tensor::zeros({std::max<int64_t>(vectors, 1)});
  master_shard_ = Tensor::zeros({std::max<int64_t>(state_numel_, 1)});
  int64_t at = 0;
  for (TrainableParam& p : params_) {
    if (!p.compute.is_same(p.master)) {
      for (const OwnedSegment& seg : p.owned)
        master_shard_.narrow(0, seg.state, seg.end - seg.begin).copy_from(segment_of(p.master, seg));
      p.master = Tensor();
      continue;
    }
    Tensor v = view(vector_slab_, at, p.grad.shape());
    at += (p.grad.numel() + kAlign - 1) / kAlign * kAlign;
    v.copy_from(p.master);
    v.set_requires_grad(true);
    v.set_grad(p.grad);
    for (nn::Parameter* ref : p.refs) ref->data = v;
    p.master = p.compute = v;
  }
  master_ = Tensor();
  masters_sharded_ = true;
}

Tensor ModelParameters::owned_master(const TrainableParam& p, const OwnedSegment& seg) const {
  if (p.master.defined()) return segment_of(p.master, seg);
  return master_shard_.narrow(0, seg.state, seg.end - seg.begin);
}

void ModelParameters::gather_updated_weights() {
  if (shard_group_ == nullptr) {
    if (computes_by_unit()) refresh_compute_weights();  // the units round the new masters when they run next
    return;
  }
  if (fsdp_) {  // the units gather the new masters when they run next
    refresh_compute_weights();
    return;
  }
  if (!masters_sharded_) {
    for (const SlabRange& b : buckets_) shard_group_->all_gather_in_place(master_.narrow(0, b.begin, b.end - b.begin));
    refresh_compute_weights();
    return;
  }
  // The compute copies of the matrices chunk by chunk (the update rounded this rank's own into them) ...
  for (const SlabRange& b : buckets_)
    shard_group_->all_gather_in_place(compute_copy_.narrow(0, b.begin, b.end - b.begin));
  // ... and the vectors: each rank's owned parts over zeros, summed (exact).
  Tensor sum = Tensor::zeros(vector_slab_.shape());
  for (TrainableParam& p : params_) {
    if (!p.compute.is_same(p.master)) continue;
    const int64_t at = (p.master.storage_offset() - vector_slab_.storage_offset()) / sizeof(float);
    for (const OwnedSegment& seg : p.owned)
      sum.narrow(0, at + seg.begin, seg.end - seg.begin).copy_from(segment_of(p.master, seg));
  }
  shard_group_->all_reduce(sum);
  vector_slab_.copy_from(sum);
}

// ---------------------------------------------------------------- FSDP

void ModelParameters::fully_shard(const FullyShardOptions& fsdp) {
  shard_group_ = fsdp.group;
  // Units and their buckets: runs of one unit, one tp placement, one compute dtype.
  std::vector<size_t> bucket_of(params_.size());
  std::map<size_t, int64_t> grad_end;  // unit -> where its gradient buffer ends (slab elements)
  size_t at_byte = 0, rows_at_byte = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const TrainableParam& p = params_[i];
    const int64_t unit = p.unit;
    const bool matrix = computes_in_bf16(bf16_, p.refs[0]->data);
    const DType dtype = matrix && bf16_native_ ? DType::BF16 : DType::F32;
    const int64_t end = i + 1 < params_.size() ? params_[i + 1].offset : numel_;
    if (units_.empty() || units_.back().id != unit) {
      TP_CHECK(units_.empty() || units_.back().id < unit, "FSDP: parameter '{}' of unit {} out of unit order", p.name,
               unit);
      units_.push_back({unit, p.offset, p.offset, {}, i, i, nullptr, nullptr, nullptr});
      grad_end[units_.size() - 1] = p.offset;
      at_byte = rows_at_byte = 0;
    }
    ParamUnit& u = units_.back();
    const bool fresh = u.buckets.empty() || layout_[u.buckets.back()].replicated != p.replicated ||
                       computes_in_bf16(bf16_, params_[i - 1].refs[0]->data) != matrix ||
                       params_[i - 1].grad_by_rows != p.grad_by_rows;
    // The by-rows matrices' weights have a buffer of their own.
    size_t& at = p.grad_by_rows ? rows_at_byte : at_byte;
    if (fresh) {
      at = (at + 63) / 64 * 64;
      u.buckets.push_back(buckets_.size());
      buckets_.push_back({p.offset, p.offset});
      layout_.push_back({dtype, at, 0, p.replicated, units_.size() - 1, p.grad_by_rows});
    }
    buckets_.back().end = end;
    at += static_cast<size_t>(end - p.offset) * dtype_size(dtype);
    if (!p.grad_by_rows) grad_end[units_.size() - 1] = end;
    u.end = end;
    u.last = i + 1;
    bucket_of[i] = buckets_.size() - 1;
    if (i + 1 == params_.size() || params_[i + 1].unit != unit) {
      u.compute = Storage::allocate(std::max<size_t>(at_byte, 64));
      if (rows_at_byte > 0) u.rows_compute = Storage::allocate(rows_at_byte);
      // The gradients by rows come last: the buffer ends before them.
      u.grad = Storage::allocate(static_cast<size_t>(std::max(grad_end[units_.size() - 1] - u.begin, int64_t{1})) *
                                 sizeof(float));
    }
  }
  assign_owned();
  int64_t state = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    layout_[b].state = state;
    state += owned_chunk(b).size;
  }
  // The masters are this rank's chunks of the loaded weights; the model's tensors
  // become views of the unit buffers (the loaded tensor is freed with its last reference).
  master_shard_ = Tensor::zeros({std::max<int64_t>(state_numel_, 1)});
  grad_shard_ = Tensor::zeros({std::max<int64_t>(state_numel_, 1)});
  for (size_t i = 0; i < params_.size(); ++i) {
    TrainableParam& p = params_[i];
    const BucketLayout& b = layout_[bucket_of[i]];
    const ParamUnit& u = units_[b.unit];
    const Tensor loaded = p.refs[0]->data.flatten();
    for (const OwnedSegment& seg : p.owned)
      master_shard_.narrow(0, seg.state, seg.end - seg.begin)
          .copy_from(loaded.narrow(0, seg.begin, seg.end - seg.begin));
    const Shape shape = p.refs[0]->data.shape();
    if (p.grad_by_rows) {
      p.grad = Tensor::wrap(Storage::allocate(static_cast<size_t>(p.refs[0]->data.numel()) * sizeof(float)), 0,
                            shape, DType::F32);
      p.grad.storage()->release();
    } else {
      p.grad = Tensor::wrap(u.grad, static_cast<size_t>(p.offset - u.begin) * sizeof(float), shape, DType::F32);
    }
    p.compute = Tensor::wrap(b.by_rows ? u.rows_compute : u.compute, b.compute_byte + static_cast<size_t>(p.offset - buckets_[bucket_of[i]].begin) *
                                                             dtype_size(b.compute),
                             shape, b.compute);
    p.master = Tensor();
    p.compute.set_requires_grad(true);
    p.compute.set_grad(p.grad);
    for (nn::Parameter* ref : p.refs) ref->data = p.compute;
  }
  master_ = Tensor();
  masters_sharded_ = true;
  for (size_t u = 0; u < units_.size(); ++u) {
    release_unit(u);
    units_[u].grad->release();
  }
}

void ModelParameters::release_unit(size_t u) {
  units_[u].compute->release();
  if (units_[u].rows_compute) units_[u].rows_compute->release();
}

void ModelParameters::gather_unit(size_t u, bool rows) {
  ParamUnit& unit = units_[u];
  unit.compute->restore();
  if (!fsdp_) {  // units without sharding: this rank's masters, rounded as the whole copy would be
    for (const TrainableParam& p : params_)
      if (p.unit == unit.id && !p.compute.is_same(p.master)) round_whole_compute_copy(p);
    return;
  }
  if (rows && unit.rows_compute) unit.rows_compute->restore();
  // This rank's chunks, from its masters (rounded where the weight computes in bf16) ...
  for (size_t i = unit.first; i < unit.last; ++i) {
    TrainableParam& p = params_[i];
    if (p.grad_by_rows && !rows) continue;
    for (const OwnedSegment& seg : p.owned) {
      const Tensor src = master_shard_.narrow(0, seg.state, seg.end - seg.begin);
      Tensor dst = segment_of(p.compute, seg);
      if (computes_in_bf16(bf16_, p.compute))  // a bf16 copy, or bf16 values in f32
        ops::round_to_bf16(src, dst);
      else
        dst.copy_from(src);
    }
  }
  // ... and everyone's, bucket by bucket.
  for (size_t b : unit.buckets) {
    const BucketLayout& l = layout_[b];
    if (l.by_rows && !rows) continue;
    shard_group_->all_gather_in_place(Tensor::wrap(l.by_rows ? unit.rows_compute : unit.compute, l.compute_byte,
                                                   {buckets_[b].end - buckets_[b].begin}, l.compute));
  }
}

Tensor ModelParameters::weight_rows(const TrainableParam& p, int64_t row0, int64_t rows, Tensor& scratch,
                                    Tensor& out) const {
  const int64_t cols = p.grad.size(1), begin = row0 * cols, end = begin + rows * cols;
  TP_CHECK(fsdp_ && p.grad_by_rows && row0 >= 0 && rows >= 1 && row0 + rows <= p.grad.size(0),
           "weight_rows: rows [{}, {}) of '{}' {} (a matrix held by rows under FSDP)", row0, row0 + rows, p.name,
           shape_str(p.grad.shape()));
  if (!scratch.defined() || scratch.numel() < rows * cols) scratch = Tensor::empty({rows * cols});
  Tensor sum = scratch.narrow(0, 0, rows * cols);
  sum.fill(0);
  // Each element from the one rank that owns it (the others add zeros: the sum is exact).
  for (const OwnedSegment& seg : p.owned) {
    const int64_t lo = std::max(begin, seg.begin), hi = std::min(end, seg.end);
    if (lo >= hi) continue;
    const Tensor src = master_shard_.narrow(0, seg.state + (lo - seg.begin), hi - lo);
    Tensor dst = sum.narrow(0, lo - begin, hi - lo);
    if (computes_in_bf16(bf16_, p.compute))
      ops::round_to_bf16(src, dst);
    else
      dst.copy_from(src);
  }
  shard_group_->all_reduce(sum);
  if (p.compute.dtype() == DType::F32) return sum.reshape({rows, cols});
  if (!out.defined() || out.numel() < rows * cols || out.dtype() != p.compute.dtype())
    out = Tensor::empty({rows * cols}, p.compute.dtype());
  Tensor values = out.narrow(0, 0, rows * cols);
  values.copy_from(sum);
  return values.reshape({rows, cols});
}

void ModelParameters::begin_unit_grads(size_t u) {
  ParamUnit& unit = units_[u];
  if (unit.grad == nullptr) return;  // a unit without sharding: its gradients are in the slab
  unit.grad->restore();
  std::memset(unit.grad->data(), 0, unit.grad->bytes());
}

void ModelParameters::reduce_unit_grads(size_t u, dist::ProcessGroup& replicate) {
  ParamUnit& unit = units_[u];
  if (unit.grad == nullptr) return;  // a unit without sharding: its gradients are in the slab
  for (size_t b : unit.buckets) {
    if (layout_[b].by_rows) continue;
    // The reduce-scatter, as an all-reduce of which this rank keeps its chunk
    // (the faster of the two on CPU ranks: data_parallel.h).
    Tensor g = Tensor::wrap(unit.grad, static_cast<size_t>(buckets_[b].begin - unit.begin) * sizeof(float),
                            {buckets_[b].end - buckets_[b].begin}, DType::F32);
    shard_group_->all_reduce(g);
    const ChunkSpan c = owned_chunk(b);
    Tensor mine = g.narrow(0, c.offset, c.size);
    if (replicate.size() > 1) replicate.all_reduce(mine);
    Tensor into = grad_shard_.narrow(0, layout_[b].state, c.size);
    ops::add_(into, mine);
  }
  unit.grad->release();
}

void ModelParameters::add_grad_rows(const TrainableParam& p, int64_t row0, const Tensor& rows,
                                    dist::ProcessGroup& replicate) {
  TP_CHECK(fsdp_ && p.grad_by_rows && rows.dtype() == DType::F32 && rows.dim() == 2 &&
               rows.size(1) == p.grad.size(1) && row0 >= 0 && row0 + rows.size(0) <= p.grad.size(0),
           "add_grad_rows: rows {} from {} do not fit '{}' {} (a gradient by rows under FSDP)",
           shape_str(rows.shape()), row0, p.name, shape_str(p.grad.shape()));
  Tensor sum = rows;
  shard_group_->all_reduce(sum);
  const int64_t cols = rows.size(1), begin = row0 * cols, end = begin + rows.numel();
  for (const OwnedSegment& seg : p.owned) {
    const int64_t lo = std::max(begin, seg.begin), hi = std::min(end, seg.end);
    if (lo >= hi) continue;
    Tensor mine = sum.flatten().narrow(0, lo - begin, hi - lo);
    if (replicate.size() > 1) replicate.all_reduce(mine);
    Tensor into = grad_shard_.narrow(0, seg.state + (lo - seg.begin), hi - lo);
    ops::add_(into, mine);
  }
}

Tensor ModelParameters::local_view(const Tensor& slab, const TrainableParam& p) {
  return view(slab, p.offset, p.grad.shape());
}

Tensor ModelParameters::gather_owned(
    const std::function<Tensor(const TrainableParam&, const OwnedSegment&)>& source) const {
  // Each rank writes its owned parts into zeros; the sum over the shard group is every part, exactly.
  Tensor full = Tensor::zeros({numel_});
  for (const TrainableParam& p : params_)
    for (const OwnedSegment& seg : p.owned)
      full.narrow(0, p.offset + seg.begin, seg.end - seg.begin).copy_from(source(p, seg));
  shard_group_->all_reduce(full);
  return full;
}

Tensor ModelParameters::full_masters() const {
  if (!masters_sharded_) return master_;
  return gather_owned([this](const TrainableParam& p, const OwnedSegment& seg) { return owned_master(p, seg); });
}

void ModelParameters::load_masters(const Tensor& full) {
  TP_CHECK(full.numel() == numel_, "load_masters: a slab of {} elements, the parameters hold {}", full.numel(), numel_);
  if (!masters_sharded_) {
    if (!full.is_same(master_)) master_.copy_from(full);
    refresh_compute_weights();
    return;
  }
  if (fsdp_) {
    for (TrainableParam& p : params_)
      for (const OwnedSegment& seg : p.owned) owned_master(p, seg).copy_from(segment_of(local_view(full, p), seg));
    refresh_compute_weights();
    return;
  }
  for (TrainableParam& p : params_) {
    const Tensor src = local_view(full, p);
    if (p.master.defined()) {  // a vector: whole on every rank
      p.master.copy_from(src);
      continue;
    }
    for (const OwnedSegment& seg : p.owned) owned_master(p, seg).copy_from(segment_of(src, seg));
    round_into_compute_copy(p, src.flatten(), 0);  // every rank read all of it
  }
}

Tensor ModelParameters::state_to_full(const Tensor& state) const {
  if (shard_group_ == nullptr) return state;
  return gather_owned([&state](const TrainableParam&, const OwnedSegment& seg) {
    return state.narrow(0, seg.state, seg.end - seg.begin);
  });
}

void ModelParameters::state_from_full(const Tensor& full, Tensor& state) const {
  if (shard_group_ == nullptr) {
    if (!full.is_same(state)) state.copy_from(full);
    return;
  }
  for (const TrainableParam& p : params_)
    for (const OwnedSegment& seg : p.owned)
      state.narrow(0, seg.state, seg.end - seg.begin).copy_from(segment_of(local_view(full, p), seg));
}

Tensor ModelParameters::gather_master(const TrainableParam& p) const {
  const Tensor local = p.master.defined() ? p.master : local_view(full_masters(), p);
  return parallel::gather_full(local, p.global_shape, p.shards, group_of(p));
}

}  // namespace tp::training
