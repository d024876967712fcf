#pragma once
// ProcessGroup: the collectives every tensor-parallel op is built from. The
// interface is backend-neutral (MPI on CPU now, NCCL on GPU later); callers only
// see tensors. Rules shared by every backend:
//   - dtypes f32, bf16, f16, i32, i64; bf16/f16 are reduced in f32 (converted,
//     reduced, rounded back once), gathers and all-to-all move raw bytes;
//   - `dim` may be negative; pieces follow torch.chunk's rule (tp::chunk_span):
//     rank r owns chunk_span(n, size, r) and trailing ranks may own nothing;
//   - every rank calls the same collectives in the same order with matching
//     dtypes (a mismatch is reported as a tp::Error where it can be detected);
//   - size 1 runs the same code and returns copies (no communication);
//   - a group is used from one thread at a time (it owns reusable scratch
//     buffers); outputs come from the Storage cache, so a steady-state loop of
//     collectives does not allocate.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tp/tensor/tensor.h"

namespace tp::dist {

enum class ReduceOp { Sum, Avg, Max };
// "sum", "avg", "max"
const char* reduce_op_name(ReduceOp op);

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place: every rank ends with op over all ranks' `t`.
  virtual void all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum) = 0;
  // Concatenation of every rank's `local` along `dim`; all shapes must be equal.
  virtual Tensor all_gather(const Tensor& local, int64_t dim) = 0;
  // Same, but the sizes along `dim` may differ between ranks (and be 0).
  virtual Tensor all_gather_uneven(const Tensor& local, int64_t dim) { return all_gather_uneven(local, dim, nullptr); }
  // ... and reports every rank's size along `dim` in `sizes` (when not null).
  virtual Tensor all_gather_uneven(const Tensor& local, int64_t dim, std::vector<int64_t>* sizes) = 0;
  // op over ranks of `full`, then this rank keeps chunk_span(full.size(dim), size, rank).
  virtual Tensor reduce_scatter(const Tensor& full, int64_t dim, ReduceOp op = ReduceOp::Sum) = 0;
  // In place: every rank ends with root's `t` (shapes and dtypes must match).
  virtual void broadcast(Tensor& t, int root) = 0;
  // broadcast for a wait that may last long (a server's ranks waiting for the
  // next request): a rank that waits more than a millisecond polls and sleeps
  // instead of spinning its core in MPI. Not counted in collective_seconds().
  virtual void broadcast_idle(Tensor& t, int root) { broadcast(t, root); }
  // Splits `input` into `size` chunks along split_dim (chunk rule), sends chunk j
  // to rank j, and concatenates the chunks received from ranks 0..size-1 along
  // concat_dim. Sizes along concat_dim may differ between ranks.
  virtual Tensor all_to_all(const Tensor& input, int64_t split_dim, int64_t concat_dim) = 0;
  // Uneven rows (torch's all_to_all_single with split sizes; MoE token dispatch):
  // rows [sum(send_counts[0..j)), + send_counts[j]) of `input` (dim 0) go to rank j;
  // the result is the rows received from ranks 0..size-1, concatenated, and
  // `recv_counts` (when not null) says how many came from each. Counts are
  // exchanged first, so a receiver needs to know nothing in advance.
  virtual Tensor all_to_all_v(const Tensor& input, const std::vector<int64_t>& send_counts,
                              std::vector<int64_t>* recv_counts = nullptr) = 0;
  virtual void barrier() = 0;

  // A flat buffer of any dtype (data parallelism's weight slabs): every rank's
  // piece of `full` (the chunk rule: rank r's piece of n elements is
  // chunk_span(n, size, r)) is its own; afterwards every rank holds every piece.
  virtual void all_gather_in_place(Tensor full) = 0;

  // A new group of the ranks that pass the same `color`, ordered by `key`
  // (collective over this group, like MPI_Comm_split). DeviceMesh uses it.
  virtual std::shared_ptr<ProcessGroup> split(int color, int key) = 0;
  // "mpi" (later "nccl"), for messages.
  virtual std::string backend() const = 0;
  // Seconds this rank has spent inside this group's collectives (blocking calls
  // calls; waiting for slower ranks included), since creation.
  // Benchmarks report communication time per step from it.
  virtual double collective_seconds() const = 0;
};

// Starts the runtime from the launcher's environment (mpirun/tprun ranks); with
// no launcher, a single process of world size 1 that never touches MPI.
// Idempotent. Also installs a terminate handler that prints
// "[rank r] error: ..." and aborts the whole job, so an uncaught exception on one
// rank never leaves the others waiting in a collective.
void init(int* argc = nullptr, char*** argv = nullptr);
ProcessGroup& world();  // calls init() when needed
int world_rank();
int world_size();
// True when this process was started by a launcher that gave it peers (size > 1).
bool is_distributed();

// Rank 0 of `group` runs `action` (writing a file, making a directory); every
// rank learns whether it threw and throws the same error, "<what>: <message>"
// (just the message when `what` is empty), so no rank is left waiting in a later
// collective. Collective.
void on_rank0(ProcessGroup& group, const std::string& what, const std::function<void()>& action);

// Takes the whole job down: prints "[rank r] error: message" and aborts every
// rank with `code` (MPI_Abort), or exits when there is no MPI job.
[[noreturn]] void abort_job(const std::string& message, int code = 1);

}  // namespace tp::dist
