// Collectives through tp::dist vs raw MPI calls on the same buffers, same run
// (and MPI's nonblocking all-reduce / reduce-scatter against its blocking all-reduce).
//   tprun --nproc-per-node 2 build/bench/distributed/bench_collectives [--reps 15]
// For each op and size (bytes of the full tensor: the all-reduce buffer, the
// all-gather output, the reduce-scatter input) both variants run alternately,
// call by call, `reps` rounds; rank 0 prints the median call time of each and
// their ratio (and the ratio of the fastest calls).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tp/distributed/mpi_process_group.h"
#include "tp/tensor/convert.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// The bf16 sum a custom MPI_Op would do: widen, add, round (at every step of the algorithm).
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<tp::bf16*>(in);
  auto* b = static_cast<tp::bf16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = tp::to_bf16(tp::to_f32(a[i]) + tp::to_f32(b[i]));
}

std::string human(size_t bytes) {
  if (bytes >= (1u << 20)) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes >> 10) + " KiB";
}

}  // namespace

int main(int argc, char** argv) {
  tp::dist::init(&argc, &argv);
  int reps = 15;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
  auto& g = dynamic_cast<tp::dist::MpiProcessGroup&>(tp::dist::world());
  MPI_Comm comm = g.comm();
  int w = g.size(), rank = g.rank();
  if (w < 2) {
    std::printf("bench_collectives needs at least 2 ranks (tprun --nproc-per-node 2 ...)\n");
    return 0;
  }
  MPI_Op bf16_op;
  MPI_Op_create(bf16_sum, 1, &bf16_op);
  if (rank == 0)
    std::printf("%d ranks, %d rounds; us per call: median (and best) of all calls\n%-22s %9s %12s %12s %8s %9s\n",
                w, reps, "op", "size", "raw MPI us", "tp us", "tp/MPI", "best/best");
  std::vector<double> ratios;
  for (size_t bytes : {size_t{4} << 10, size_t{64} << 10, size_t{1} << 20, size_t{8} << 20, size_t{64} << 20}) {
    int64_t n = static_cast<int64_t>(bytes / 4);
    int iters = static_cast<int>(std::clamp<size_t>((size_t{16} << 20) / bytes, 2, 200));
    tp::Tensor full = tp::Tensor::rand({n}, 1, -1.f, 1.f);
    tp::Tensor local = full.narrow(0, 0, n / w).clone();
    tp::Tensor out_full = tp::Tensor::empty({n}), out_local = tp::Tensor::empty({n / w});
    tp::Tensor full_bf16 = full.to(tp::DType::BF16), wide = tp::Tensor::empty({n});
    int cn = static_cast<int>(n), cl = static_cast<int>(n / w);
    struct Case {
      const char* name;
      std::function<void()> raw, ours;
    };
    std::vector<Case> cases = {
        {"all_reduce f32", [&] { MPI_Allreduce(MPI_IN_PLACE, full.raw_data(), cn, MPI_FLOAT, MPI_SUM, comm); },
         [&] { g.all_reduce(full); }},
        {"all_gather f32",
         [&] { MPI_Allgather(local.raw_data(), cl, MPI_FLOAT, out_full.raw_data(), cl, MPI_FLOAT, comm); },
         [&] { tp::Tensor o = g.all_gather(local, 0); }},
        {"reduce_scatter f32",
         [&] { MPI_Reduce_scatter_block(full.raw_data(), out_local.raw_data(), cl, MPI_FLOAT, MPI_SUM, comm); },
         [&] { tp::Tensor o = g.reduce_scatter(full, 0); }},
        // bf16: ours widens to f32, all-reduces, rounds once; the baseline is a
        // custom bf16 MPI_Op (half the bytes on the wire, rounds at every step).
        {"all_reduce bf16",
         [&] { MPI_Allreduce(MPI_IN_PLACE, full_bf16.raw_data(), cn, MPI_UINT16_T, bf16_op, comm); },
         [&] { g.all_reduce(full_bf16); }},
        // The other way to sum bf16 in f32: widen, all-reduce f32 (twice the bytes), round.
        {"bf16 vs widen-to-f32",
         [&] {
           tp::convert(full_bf16.raw_data(), tp::DType::BF16, wide.raw_data(), tp::DType::F32, n);
           MPI_Allreduce(MPI_IN_PLACE, wide.raw_data(), cn, MPI_FLOAT, MPI_SUM, comm);
           tp::convert(wide.raw_data(), tp::DType::F32, full_bf16.raw_data(), tp::DType::BF16, n);
         },
         [&] { g.all_reduce(full_bf16); }},
        // Why data parallelism uses blocking collectives on these ranks (not a
        // pair of equals): MPI's nonblocking forms, started and waited for at
        // once, against the blocking all-reduce of the same buffer.
        {"Iallreduce vs Allreduce", [&] { MPI_Allreduce(MPI_IN_PLACE, full.raw_data(), cn, MPI_FLOAT, MPI_SUM, comm); },
         [&] {
           MPI_Request r;
           MPI_Iallreduce(MPI_IN_PLACE, full.raw_data(), cn, MPI_FLOAT, MPI_SUM, comm, &r);
           MPI_Wait(&r, MPI_STATUS_IGNORE);
         }},
        {"Ireduce_scatter vs Allr", [&] { MPI_Allreduce(MPI_IN_PLACE, full.raw_data(), cn, MPI_FLOAT, MPI_SUM, comm); },
         [&] {
           MPI_Request r;
           MPI_Ireduce_scatter_block(full.raw_data(), out_local.raw_data(), cl, MPI_FLOAT, MPI_SUM, comm, &r);
           MPI_Wait(&r, MPI_STATUS_IGNORE);
         }},
        // Not a pair of equals: the cost of gathering along the last dim (reorder) vs dim 0.
        {"all_gather f32 dim -1",
         [&] { MPI_Allgather(local.raw_data(), cl, MPI_FLOAT, out_full.raw_data(), cl, MPI_FLOAT, comm); },
         [&] { tp::Tensor o = g.all_gather(local.reshape({16, n / w / 16}), -1); }},
    };
    for (Case& c : cases) {
      std::vector<double> raw, ours;
      c.raw();  // warm-up: pages, caches, scratch buffers
      c.ours();
      // Calls alternate one by one, each timed on its own, so that load from
      // other processes (this machine is shared) hits both sides alike.
      for (int r = 0; r < reps; ++r) {
        MPI_Barrier(comm);
        for (int i = 0; i < iters; ++i) {
          auto t0 = Clock::now();
          c.raw();
          auto t1 = Clock::now();
          c.ours();
          auto t2 = Clock::now();
          raw.push_back(seconds(t0, t1));
          ours.push_back(seconds(t1, t2));
        }
      }
      double a = median(raw) * 1e6, b = median(ours) * 1e6;
      double best = *std::min_element(ours.begin(), ours.end()) / *std::min_element(raw.begin(), raw.end());
      if (std::strstr(c.name, "f32") && !std::strstr(c.name, "dim")) ratios.push_back(b / a);
      if (rank == 0)
        std::printf("%-22s %9s %12.1f %12.1f %8.2f %9.2f\n", c.name, human(bytes).c_str(), a, b, b / a, best);
    }
  }
  if (rank == 0) {
    std::sort(ratios.begin(), ratios.end());
    std::printf("f32 all_reduce/all_gather/reduce_scatter: median tp/MPI %.2f, worst %.2f\n", median(ratios),
                ratios.back());
  }
  MPI_Op_free(&bf16_op);
  return 0;
}
