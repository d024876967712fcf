#include "tp/distributed/mpi_process_group.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <thread>
#include <type_traits>

#include "tp/tensor/convert.h"

namespace tp::dist {
namespace {

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fail("{} failed: {}", call, std::string(text, len));
}

int to_count(int64_t n, const char* what) {
  TP_CHECK(n <= INT_MAX, "{}: {} elements exceed MPI's int count limit ({}); split the tensor", what, n, INT_MAX);
  return static_cast<int>(n);
}

// The MPI type that moves (not reduces) one element of `dtype`.
MPI_Datatype move_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return MPI_FLOAT;
    case DType::BF16:
    case DType::F16: return MPI_UINT16_T;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::U8: return MPI_UINT8_T;
  }
  fail("unsupported dtype");
}

// The type reductions run in: half types are widened to f32 first.
DType reduce_dtype(DType dtype) { return dtype == DType::BF16 || dtype == DType::F16 ? DType::F32 : dtype; }

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Max ? MPI_MAX : MPI_SUM; }

// A reduction of 16-bit floats computed in f32, element blocks widened with the
// vectorized converters.
template <class H, bool kMax>
void half_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const H* a = static_cast<const H*>(in);
  H* b = static_cast<H*>(inout);
  if constexpr (std::is_same_v<H, bf16>) {  // one fused pass: bf16 <-> f32 is a shift and a rounding add
    for (int i = 0; i < *len; ++i) {
      float x = to_f32(a[i]), y = to_f32(b[i]);
      b[i] = to_bf16(kMax ? std::max(x, y) : x + y);
    }
    return;
  }
  constexpr int kBlock = 1024;
  float fa[kBlock], fb[kBlock];
  DType d = dtype_of<H>::value;
  for (int start = 0; start < *len; start += kBlock) {
    int m = std::min(kBlock, *len - start);
    convert(a + start, d, fa, DType::F32, m);
    convert(b + start, d, fb, DType::F32, m);
    for (int i = 0; i < m; ++i) fb[i] = kMax ? std::max(fa[i], fb[i]) : fa[i] + fb[i];
    convert(fb, DType::F32, b + start, d, m);
  }
}

// The MPI op that reduces bf16/f16 in place without widening the buffer, when
// that gives the same result as widening to f32 and rounding once: max (exact in
// any order), and sum over exactly two ranks (one addition, one rounding per
// element whatever the algorithm). Half the bytes on the wire. MPI_OP_NULL otherwise.
MPI_Op half_op(DType dtype, ReduceOp op, int ranks) {
  if (dtype != DType::BF16 && dtype != DType::F16) return MPI_OP_NULL;
  if (!(op == ReduceOp::Max || (op == ReduceOp::Sum && ranks == 2))) return MPI_OP_NULL;
  static MPI_Op ops[2][2] = {{MPI_OP_NULL, MPI_OP_NULL}, {MPI_OP_NULL, MPI_OP_NULL}};
  int i = dtype == DType::F16, j = op == ReduceOp::Max;
  if (ops[i][j] == MPI_OP_NULL) {
    MPI_User_function* fns[2][2] = {{half_reduce<bf16, false>, half_reduce<bf16, true>},
                                    {half_reduce<f16, false>, half_reduce<f16, true>}};
    MPI_Op_create(fns[i][j], 1, &ops[i][j]);
  }
  return ops[i][j];
}

// Avg is a sum followed by this division (integers truncate, like torch).
void divide(void* data, DType dtype, int64_t n, int by) {
  switch (dtype) {
    case DType::F32: {
      float* p = static_cast<float*>(data);
      float s = 1.f / static_cast<float>(by);
      for (int64_t i = 0; i < n; ++i) p[i] *= s;
      return;
    }
    case DType::I32: {
      int32_t* p = static_cast<int32_t*>(data);
      for (int64_t i = 0; i < n; ++i) p[i] /= by;
      return;
    }
    case DType::I64: {
      int64_t* p = static_cast<int64_t*>(data);
      for (int64_t i = 0; i < n; ++i) p[i] /= by;
      return;
    }
    default: fail("divide: unexpected dtype {}", dtype_name(dtype));
  }
}

// Copies `parts` blocks laid out one after another ([part][outer][n_p][inner])
// into `dst` ([outer][sum n_p][inner]) — or the reverse when `to_parts`.
void interleave(char* dst, const char* src, int64_t outer, const std::vector<int64_t>& ns, int64_t inner_bytes,
                bool to_parts) {
  int64_t total = 0;
  for (int64_t n : ns) total += n;
  const char* parts_base = to_parts ? dst : src;
  int64_t part_offset = 0;
  int64_t n_offset = 0;
  for (int64_t n : ns) {
    int64_t block = n * inner_bytes;
    for (int64_t o = 0; o < outer; ++o) {
      const char* part = parts_base + part_offset + o * block;
      char* whole_off = const_cast<char*>(to_parts ? src : dst) + (o * total + n_offset) * inner_bytes;
      if (to_parts)
        std::memcpy(const_cast<char*>(part), whole_off, block);
      else
        std::memcpy(whole_off, part, block);
    }
    part_offset += outer * block;
    n_offset += n;
  }
}

// MPI counts and displacements (in elements) of pieces [outer, n_r, inner], one per rank.
void fill_counts(std::vector<int>& counts, std::vector<int>& displs, int64_t outer, const std::vector<int64_t>& ns,
                 int64_t inner, const char* what) {
  counts.resize(ns.size());
  displs.resize(ns.size());
  int64_t offset = 0;
  for (size_t r = 0; r < ns.size(); ++r) {
    counts[r] = to_count(outer * ns[r] * inner, what);
    displs[r] = to_count(offset, what);
    offset += counts[r];
  }
}

// Adds the time its scope takes to a group's collective clock.
class CollectiveClock {
 public:
  explicit CollectiveClock(double& total) : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~CollectiveClock() {
    total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  double& total_;
  std::chrono::steady_clock::time_point start_;
};

// Large reductions and gathers go in pieces of this many bytes. OpenMPI's
// algorithms allocate temporaries of the message's size; above glibc's mmap
// threshold each call faults fresh pages in, which on this machine made a
// 1.1 GB all-reduce take ~2 s (0.5 GB/s) against 8 GB/s for 8 MiB pieces.
constexpr int64_t kPieceBytes = int64_t{8} << 20;

// How a rank waits for a collective its peers have not reached: polling for
// `spin` (a peer that is running arrives within it), then sleeping between
// polls, `pause` doubling up to `max_pause`. Open MPI's blocking calls poll
// without end: when a peer has been descheduled (another process wants its
// core), the waiting rank would burn its own core for the peer's whole time
// slice, where sleeping lets the kernel run the peer there.
struct WaitPolicy {
  std::chrono::microseconds spin, pause, max_pause;
};
// Decode's all-reduces come every ~0.5-1 ms, and a running peer arrives within
// tens of microseconds of the other; a sleep costs ~60 us or more (timer slack).
constexpr WaitPolicy kCollectiveWait{std::chrono::microseconds(100), std::chrono::microseconds(20),
                                     std::chrono::microseconds(200)};
// An idle server's ranks wait for the next request for seconds.
constexpr WaitPolicy kIdleWait{std::chrono::milliseconds(1), std::chrono::microseconds(50),
                               std::chrono::milliseconds(1)};

int wait_politely(MPI_Request& request, const WaitPolicy& policy) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  std::chrono::microseconds pause = policy.pause;
  for (int done = 0;;) {
    if (const int rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE); rc != MPI_SUCCESS || done) return rc;
    if (Clock::now() - start < policy.spin) continue;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, policy.max_pause);
  }
}

// Below this, a collective is started non-blocking and waited for politely: its
// cost is latency, not bandwidth. Above, Open MPI's blocking forms are faster
// (a nonblocking 8-64 MiB all-reduce takes 1.8-2.6x the blocking one here).
constexpr int64_t kPoliteBytes = int64_t{256} << 10;

// MPI_Allreduce in place over `n` elements of `esize` bytes, piece by piece.
int allreduce_in_pieces(void* buf, int64_t n, size_t esize, MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  if (n * static_cast<int64_t>(esize) <= kPoliteBytes) {
    MPI_Request request;
    if (const int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, static_cast<int>(n), type, op, comm, &request);
        rc != MPI_SUCCESS)
      return rc;
    return wait_politely(request, kCollectiveWait);
  }
  const int64_t step = std::max<int64_t>(1, kPieceBytes / static_cast<int64_t>(esize));
  for (int64_t at = 0; at < n; at += step) {
    const int rc = MPI_Allreduce(MPI_IN_PLACE, static_cast<char*>(buf) + at * esize,
                                 static_cast<int>(std::min(step, n - at)), type, op, comm);
    if (rc != MPI_SUCCESS) return rc;
  }
  return MPI_SUCCESS;
}

// MPI_Allgather of `count` elements per rank into `out` (`out_bytes` in all).
int allgather(const void* local, int count, MPI_Datatype type, void* out, int64_t out_bytes, MPI_Comm comm) {
  if (out_bytes > kPoliteBytes) return MPI_Allgather(local, count, type, out, count, type, comm);
  MPI_Request request;
  if (const int rc = MPI_Iallgather(local, count, type, out, count, type, comm, &request); rc != MPI_SUCCESS) return rc;
  return wait_politely(request, kCollectiveWait);
}

void check_dtype_supported(const Tensor& t, const char* what) {
  TP_CHECK(t.defined(), "{}: the tensor is undefined", what);
}

}  // namespace

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

void* MpiProcessGroup::Scratch::get(size_t bytes) {
  if (!storage || storage->bytes() < bytes) storage = Storage::allocate(bytes);
  return storage->data();
}

MpiProcessGroup::MpiProcessGroup(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
  if (comm_ == MPI_COMM_NULL) return;
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  // Errors come back as return codes and become tp::Error (which the CLI and
  // the terminate handler turn into a job abort) instead of killing silently.
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
}

MpiProcessGroup::~MpiProcessGroup() {
  int finalized = 1;
  MPI_Finalized(&finalized);
  if (owned_ && comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

void MpiProcessGroup::all_reduce(Tensor& t, ReduceOp op) {
  CollectiveClock clock(collective_seconds_);
  check_dtype_supported(t, "all_reduce");
  if (size_ == 1) return;
  int64_t n = t.numel();
  if (MPI_Op half = half_op(t.dtype(), op, size_); half != MPI_OP_NULL) {
    check_mpi(allreduce_in_pieces(t.raw_data(), n, 2, MPI_UINT16_T, half, comm_), "MPI_Allreduce");
    return;
  }
  DType rd = reduce_dtype(t.dtype());
  void* buf = t.raw_data();
  if (rd != t.dtype()) {  // bf16/f16: reduce in f32, round once at the end
    buf = scratch_a_.get(n * sizeof(float));
    convert(t.raw_data(), t.dtype(), buf, DType::F32, n);
  }
  check_mpi(allreduce_in_pieces(buf, n, dtype_size(rd), move_type(rd), mpi_op(op), comm_), "MPI_Allreduce");
  if (op == ReduceOp::Avg) divide(buf, rd, n, size_);
  if (rd != t.dtype()) convert(buf, DType::F32, t.raw_data(), t.dtype(), n);
}

Tensor MpiProcessGroup::all_gather(const Tensor& local, int64_t dim) {
  CollectiveClock clock(collective_seconds_);
  check_dtype_supported(local, "all_gather");
  int64_t d = normalize_dim(dim, local.dim());
  Shape out_shape = local.shape();
  out_shape[d] *= size_;
  Tensor out = Tensor::empty(out_shape, local.dtype());
  if (size_ == 1) {
    std::memcpy(out.raw_data(), local.raw_data(), local.nbytes());
    return out;
  }
  DimSplit s = split_at(local.shape(), d);
  int count = to_count(local.numel(), "all_gather");
  MPI_Datatype type = move_type(local.dtype());
  if (s.outer == 1) {  // pieces are contiguous in the output: gather straight into it
    check_mpi(allgather(local.raw_data(), count, type, out.raw_data(), out.nbytes(), comm_), "MPI_Allgather");
    return out;
  }
  void* parts = scratch_a_.get(out.nbytes());
  check_mpi(allgather(local.raw_data(), count, type, parts, out.nbytes(), comm_), "MPI_Allgather");
  interleave(static_cast<char*>(out.raw_data()), static_cast<const char*>(parts), s.outer,
             std::vector<int64_t>(size_, s.n), s.inner * dtype_size(local.dtype()), false);
  return out;
}

std::vector<Shape> MpiProcessGroup::exchange_shapes(const Tensor& t, int64_t free_dim, const char* what) {
  constexpr int kMaxDims = 8;
  TP_CHECK(t.dim() <= kMaxDims, "{}: tensors of rank {} are not supported (at most {})", what, t.dim(), kMaxDims);
  std::vector<int64_t> mine(2 + kMaxDims, -1);
  mine[0] = static_cast<int64_t>(t.dtype());
  mine[1] = t.dim();
  for (int64_t i = 0; i < t.dim(); ++i) mine[2 + i] = t.shape()[i];
  meta_.resize(mine.size() * size_);
  check_mpi(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_INT64_T, meta_.data(),
                          static_cast<int>(mine.size()), MPI_INT64_T, comm_),
            "MPI_Allgather (shapes)");
  std::vector<Shape> shapes(size_);
  for (int r = 0; r < size_; ++r) {
    const int64_t* m = &meta_[r * mine.size()];
    TP_CHECK(m[0] == mine[0] && m[1] == mine[1],
             "{}: rank {} has a {} tensor of rank {} but rank {} has a {} tensor of rank {}; every rank must pass "
             "the same dtype and rank",
             what, rank_, dtype_name(t.dtype()), t.dim(), r, dtype_name(static_cast<DType>(m[0])), m[1]);
    shapes[r].assign(m + 2, m + 2 + m[1]);
    for (int64_t i = 0; i < t.dim(); ++i)
      TP_CHECK(i == free_dim || shapes[r][i] == t.shape()[i],
               "{}: rank {} has shape {} but rank {} has shape {}; they may differ only in dimension {}", what,
               rank_, shape_str(t.shape()), r, shape_str(shapes[r]), free_dim);
  }
  return shapes;
}

Tensor MpiProcessGroup::all_gather_uneven(const Tensor& local, int64_t dim, std::vector<int64_t>* sizes) {
  CollectiveClock clock(collective_seconds_);
  check_dtype_supported(local, "all_gather_uneven");
  int64_t d = normalize_dim(dim, local.dim());
  if (size_ == 1) {
    if (sizes) *sizes = {local.shape()[d]};
    return local.clone();
  }
  std::vector<Shape> shapes = exchange_shapes(local, d, "all_gather_uneven");
  std::vector<int64_t> ns(size_);
  Shape out_shape = local.shape();
  out_shape[d] = 0;
  for (int r = 0; r < size_; ++r) out_shape[d] += ns[r] = shapes[r][d];
  if (sizes) *sizes = ns;
  Tensor out = Tensor::empty(out_shape, local.dtype());
  DimSplit s = split_at(local.shape(), d);
  fill_counts(counts_, displs_, s.outer, ns, s.inner, "all_gather_uneven");
  MPI_Datatype type = move_type(local.dtype());
  void* parts = s.outer == 1 ? out.raw_data() : scratch_a_.get(out.nbytes());
  check_mpi(MPI_Allgatherv(local.raw_data(), counts_[rank_], type, parts, counts_.data(), displs_.data(), type,
                           comm_),
            "MPI_Allgatherv");
  if (s.outer != 1)
    interleave(static_cast<char*>(out.raw_data()), static_cast<const char*>(parts), s.outer, ns,
               s.inner * dtype_size(local.dtype()), false);
  return out;
}

Tensor MpiProcessGroup::reduce_scatter(const Tensor& full, int64_t dim, ReduceOp op) {
  CollectiveClock clock(collective_seconds_);
  check_dtype_supported(full, "reduce_scatter");
  int64_t d = normalize_dim(dim, full.dim());
  DimSplit s = split_at(full.shape(), d);
  std::vector<int64_t> ns(size_);
  for (int r = 0; r < size_; ++r) ns[r] = chunk_span(s.n, size_, r).size;
  Shape out_shape = full.shape();
  out_shape[d] = ns[rank_];
  Tensor out = Tensor::empty(out_shape, full.dtype());
  if (size_ == 1) {
    std::memcpy(out.raw_data(), full.raw_data(), full.nbytes());
    return out;
  }
  MPI_Op half = half_op(full.dtype(), op, size_);
  DType rd = half != MPI_OP_NULL ? full.dtype() : reduce_dtype(full.dtype());
  MPI_Op reduce = half != MPI_OP_NULL ? half : mpi_op(op);
  size_t esize = dtype_size(rd);
  int64_t n = full.numel();
  // The send buffer must be [rank][piece] in the reduction dtype; reorder and
  // widen only when needed (scratch b holds the reordered narrow copy).
  const void* send = full.raw_data();
  if (s.outer != 1) {
    void* packed = scratch_b_.get(full.nbytes());
    interleave(static_cast<char*>(packed), static_cast<const char*>(full.raw_data()), s.outer, ns,
               s.inner * dtype_size(full.dtype()), true);
    send = packed;
  }
  if (rd != full.dtype()) {
    void* wide = scratch_a_.get(n * esize);
    convert(send, full.dtype(), wide, rd, n);
    send = wide;
  }
  fill_counts(counts_, displs_, s.outer, ns, s.inner, "reduce_scatter");
  bool even = std::all_of(counts_.begin(), counts_.end(), [&](int c) { return c == counts_[0]; });
  int64_t out_n = out.numel();
  void* recv = rd == full.dtype() ? out.raw_data() : scratch_b_.get(out_n * esize);
  MPI_Datatype type = move_type(rd);
  if (even)
    check_mpi(MPI_Reduce_scatter_block(send, recv, counts_[0], type, reduce, comm_), "MPI_Reduce_scatter_block");
  else
    check_mpi(MPI_Reduce_scatter(send, recv, counts_.data(), type, reduce, comm_), "MPI_Reduce_scatter");
  if (op == ReduceOp::Avg) divide(recv, rd, out_n, size_);
  if (rd != full.dtype()) convert(recv, rd, out.raw_data(), full.dtype(), out_n);
  return out;
}

void MpiProcessGroup::broadcast(Tensor& t, int root) {
  CollectiveClock clock(collective_seconds_);
  check_dtype_supported(t, "broadcast");
  TP_CHECK(root >= 0 && root < size_, "broadcast: root {} is not a rank of this group (size {})", root, size_);
  if (size_ == 1) return;
  check_mpi(MPI_Bcast(t.raw_data(), to_count(t.numel(), "broadcast"), move_type(t.dtype()), root, comm_),
            "MPI_Bcast");
}

void MpiProcessGroup::broadcast_idle(Tensor& t, int root) {
  check_dtype_supported(t, "broadcast");
  TP_CHECK(root >= 0 && root < size_, "broadcast: root {} is not a rank of this group (size {})", root, size_);
  if (size_ == 1) return;
  MPI_Request request;
  check_mpi(MPI_Ibcast(t.raw_data(), to_count(t.numel(), "broadcast"), move_type(t.dtype()), root, comm_, &request),
            "MPI_Ibcast");
  // A busy server's next step is within the first millisecond; after it an idle
  // rank costs ~0% of a core, and wakes within a millisecond of the broadcast.
  check_mpi(wait_politely(request, kIdleWait), "MPI_Test");
}

Tensor MpiProcessGroup::all_to_all(const Tensor& input, int64_t split_dim, int64_t concat_dim) {
  CollectiveClock clock(collective_seconds_);
  check_dtype_supported(input, "all_to_all");
  int64_t sd = normalize_dim(split_dim, input.dim());
  int64_t cd = normalize_dim(concat_dim, input.dim());
  if (size_ == 1) return input.clone();
  std::vector<Shape> shapes = exchange_shapes(input, cd, "all_to_all");
  size_t esize = dtype_size(input.dtype());
  MPI_Datatype type = move_type(input.dtype());

  // Send: chunk j of split_dim goes to rank j, packed [j][outer][n_j][inner].
  DimSplit s = split_at(input.shape(), sd);
  std::vector<int64_t> send_ns(size_);
  for (int j = 0; j < size_; ++j) send_ns[j] = chunk_span(s.n, size_, j).size;
  fill_counts(counts_, displs_, s.outer, send_ns, s.inner, "all_to_all");
  const void* send = input.raw_data();
  if (s.outer != 1) {
    void* packed = scratch_a_.get(input.nbytes());
    interleave(static_cast<char*>(packed), static_cast<const char*>(input.raw_data()), s.outer, send_ns,
               s.inner * esize, true);
    send = packed;
  }

  // Receive: rank i's chunk `rank_`, whose size along concat_dim is rank i's.
  std::vector<int64_t> recv_ns(size_);
  Shape out_shape = input.shape();
  out_shape[sd] = chunk_span(s.n, size_, rank_).size;
  out_shape[cd] = 0;
  for (int i = 0; i < size_; ++i) {
    Shape piece = shapes[i];
    piece[sd] = chunk_span(s.n, size_, rank_).size;
    recv_ns[i] = piece[cd];
    out_shape[cd] += piece[cd];
  }
  if (cd == sd) {  // every piece is this rank's chunk of the same dim: sizes follow from the chunk rule
    out_shape[cd] = 0;
    for (int i = 0; i < size_; ++i) out_shape[cd] += recv_ns[i] = chunk_span(shapes[i][sd], size_, rank_).size;
  }
  Tensor out = Tensor::empty(out_shape, input.dtype());
  DimSplit c = split_at(out_shape, cd);
  fill_counts(counts2_, displs2_, c.outer, recv_ns, c.inner, "all_to_all");
  void* recv = c.outer == 1 ? out.raw_data() : scratch_b_.get(out.nbytes());
  check_mpi(MPI_Alltoallv(send, counts_.data(), displs_.data(), type, recv, counts2_.data(), displs2_.data(), type,
                          comm_),
            "MPI_Alltoallv");
  if (c.outer != 1)
    interleave(static_cast<char*>(out.raw_data()), static_cast<const char*>(recv), c.outer, recv_ns, c.inner * esize,
               false);
  return out;
}

Tensor MpiProcessGroup::all_to_all_v(const Tensor& input, const std::vector<int64_t>& send_counts,
                                     std::vector<int64_t>* recv_counts) {
  CollectiveClock clock(collective_seconds_);
  check_dtype_supported(input, "all_to_all_v");
  TP_CHECK(input.dim() >= 1, "all_to_all_v: needs a tensor with a row dimension, got a scalar");
  TP_CHECK(static_cast<int>(send_counts.size()) == size_, "all_to_all_v: {} send counts for a group of {} ranks",
           send_counts.size(), size_);
  int64_t rows = 0;
  for (int64_t c : send_counts) {
    TP_CHECK(c >= 0, "all_to_all_v: negative send count {}", c);
    rows += c;
  }
  TP_CHECK(rows == input.size(0), "all_to_all_v: send counts add up to {} rows, the input has {}", rows,
           input.size(0));
  if (size_ == 1) {
    if (recv_counts != nullptr) *recv_counts = send_counts;
    return input.clone();
  }
  // Every rank's row shape and dtype must agree; only the row count is free.
  exchange_shapes(input, 0, "all_to_all_v");
  std::vector<int64_t> received(size_);
  check_mpi(MPI_Alltoall(send_counts.data(), 1, MPI_INT64_T, received.data(), 1, MPI_INT64_T, comm_),
            "MPI_Alltoall");
  int64_t row_elems = 1;
  for (int64_t d = 1; d < input.dim(); ++d) row_elems *= input.size(d);
  Shape out_shape = input.shape();
  out_shape[0] = 0;
  for (int64_t n : received) out_shape[0] += n;
  return all_to_all_v_rows(input, send_counts, received, row_elems, out_shape, recv_counts);
}

Tensor MpiProcessGroup::all_to_all_v_rows(const Tensor& input, const std::vector<int64_t>& send_counts,
                                          const std::vector<int64_t>& received, int64_t row_elems,
                                          const Shape& out_shape, std::vector<int64_t>* recv_counts) {
  Tensor out = Tensor::empty(out_shape, input.dtype());
  fill_counts(counts_, displs_, 1, send_counts, row_elems, "all_to_all_v");
  fill_counts(counts2_, displs2_, 1, received, row_elems, "all_to_all_v");
  const MPI_Datatype type = move_type(input.dtype());
  check_mpi(MPI_Alltoallv(input.raw_data(), counts_.data(), displs_.data(), type, out.raw_data(), counts2_.data(),
                          displs2_.data(), type, comm_),
            "MPI_Alltoallv");
  if (recv_counts != nullptr) *recv_counts = received;
  return out;
}

void MpiProcessGroup::barrier() {
  CollectiveClock clock(collective_seconds_);
  if (size_ == 1) return;
  check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
}

void MpiProcessGroup::all_gather_in_place(Tensor full) {
  CollectiveClock clock(collective_seconds_);
  TP_CHECK(full.defined() && full.dim() == 1, "all_gather_in_place: needs a 1-D tensor, got {}",
           full.defined() ? shape_str(full.shape()) : std::string("none"));
  if (size_ == 1) return;
  const int64_t n = full.numel();
  const int64_t esize = static_cast<int64_t>(dtype_size(full.dtype()));
  // Every rank's piece advances by the same step per round, so a round moves at most kPieceBytes.
  const int64_t step = std::max<int64_t>(1, kPieceBytes / esize / size_);
  const int64_t longest = chunk_span(n, size_, 0).size;
  counts_.resize(size_);
  displs_.resize(size_);
  for (int64_t at = 0; at < std::max<int64_t>(longest, 1); at += step) {
    for (int r = 0; r < size_; ++r) {
      const ChunkSpan span = chunk_span(n, size_, r);
      const int64_t lo = std::min(span.size, at), hi = std::min(span.size, at + step);
      counts_[r] = to_count(hi - lo, "all_gather_in_place");
      displs_[r] = to_count(span.offset + lo, "all_gather_in_place");
    }
    check_mpi(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, full.raw_data(), counts_.data(), displs_.data(),
                             move_type(full.dtype()), comm_),
              "MPI_Allgatherv");
  }
}

std::shared_ptr<ProcessGroup> MpiProcessGroup::split(int color, int key) {
  if (comm_ == MPI_COMM_NULL) return std::make_shared<MpiProcessGroup>(MPI_COMM_NULL, false);
  MPI_Comm sub;
  check_mpi(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
  return std::make_shared<MpiProcessGroup>(sub, true);
}

}  // namespace tp::dist
