#pragma once
// ProcessGroup over an MPI communicator (OpenMPI's shared-memory transport on
// one node, TCP/IB across nodes). A group without a communicator is the
// single-process world used when no launcher started us.
#include <mpi.h>

#include <memory>
#include <vector>

#include "tp/distributed/process_group.h"

namespace tp::dist {

class MpiProcessGroup final : public ProcessGroup {
 public:
  // Takes ownership of `comm` when `owned` (freed on destruction). MPI_COMM_NULL: size 1, no MPI.
  MpiProcessGroup(MPI_Comm comm, bool owned);
  ~MpiProcessGroup() override;
  MpiProcessGroup(const MpiProcessGroup&) = delete;
  MpiProcessGroup& operator=(const MpiProcessGroup&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum) override;
  Tensor all_gather(const Tensor& local, int64_t dim) override;
  using ProcessGroup::all_gather_uneven;
  Tensor all_gather_uneven(const Tensor& local, int64_t dim, std::vector<int64_t>* sizes) override;
  Tensor reduce_scatter(const Tensor& full, int64_t dim, ReduceOp op = ReduceOp::Sum) override;
  void broadcast(Tensor& t, int root) override;
  void broadcast_idle(Tensor& t, int root) override;
  Tensor all_to_all(const Tensor& input, int64_t split_dim, int64_t concat_dim) override;
  Tensor all_to_all_v(const Tensor& input, const std::vector<int64_t>& send_counts,
                      std::vector<int64_t>* recv_counts = nullptr) override;
  void barrier() override;
  void all_gather_in_place(Tensor full) override;
  std::shared_ptr<ProcessGroup> split(int color, int key) override;
  std::string backend() const override { return "mpi"; }
  double collective_seconds() const override { return collective_seconds_; }

  MPI_Comm comm() const { return comm_; }

 private:
  // A grow-only buffer kept across calls, so steady-state collectives do not
  // allocate (and do not page-fault: Storage uses huge pages for big blocks).
  struct Scratch {
    std::shared_ptr<Storage> storage;
    void* get(size_t bytes);
  };
  // Every rank's shape along with dtype, checked for agreement except along `free_dim`.
  std::vector<Shape> exchange_shapes(const Tensor& t, int64_t free_dim, const char* what);
  // all_to_all_v once the counts are known: rows of `row_elems` elements.
  Tensor all_to_all_v_rows(const Tensor& input, const std::vector<int64_t>& send_counts,
                           const std::vector<int64_t>& received, int64_t row_elems, const Shape& out_shape,
                           std::vector<int64_t>* recv_counts);

  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0;
  int size_ = 1;
  Scratch scratch_a_, scratch_b_;
  std::vector<int> counts_, displs_, counts2_, displs2_;
  std::vector<int64_t> meta_;
  double collective_seconds_ = 0;
};

}  // namespace tp::dist
