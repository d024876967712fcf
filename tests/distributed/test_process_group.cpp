// Every collective and dtype against a serial reference that each rank computes
// from every rank's (deterministic) input.
#include <time.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <thread>

#include "dist_test_util.h"
#include "tp/distributed/process_group.h"

namespace tp::dist {
namespace {

using testing::expect_close;
using testing::rank_input;

const DType kDtypes[] = {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64};
const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max};

double tolerance(DType d) { return d == DType::F32 ? 1e-5 : 0; }

// op over ranks of rank_input(shape, r, dtype), computed in double and rounded once.
Tensor reduced_reference(const Shape& shape, DType dtype, ReduceOp op, int size, uint64_t salt = 0) {
  std::vector<double> acc(numel(shape), op == ReduceOp::Max ? -1e300 : 0.0);
  for (int r = 0; r < size; ++r) {
    std::vector<float> v = rank_input(shape, r, dtype, salt).to_vector();
    for (size_t i = 0; i < v.size(); ++i) acc[i] = op == ReduceOp::Max ? std::max(acc[i], double(v[i])) : acc[i] + v[i];
  }
  std::vector<float> out(acc.size());
  for (size_t i = 0; i < acc.size(); ++i) {
    double x = acc[i];
    if (op == ReduceOp::Avg) x = is_floating(dtype) ? x / size : std::trunc(x / size);
    out[i] = static_cast<float>(x);
  }
  Tensor t = Tensor::empty(shape, dtype);
  t.copy_from(Tensor::from_vector(out, shape));
  return t;
}

std::string label(const char* what, DType d, int64_t dim = 0) {
  return fmt::format("{} {} dim {}", what, dtype_name(d), dim);
}

TEST(ProcessGroup, RankAndSize) {
  ProcessGroup& g = world();
  EXPECT_GE(g.rank(), 0);
  EXPECT_LT(g.rank(), g.size());
  EXPECT_EQ(std::to_string(g.rank()), std::getenv("RANK"));
  EXPECT_EQ(std::to_string(g.size()), std::getenv("WORLD_SIZE"));
}

TEST(ProcessGroup, AllReduceEveryOpAndDtype) {
  ProcessGroup& g = world();
  for (DType d : kDtypes)
    for (ReduceOp op : kOps) {
      Tensor t = rank_input({5, 7}, g.rank(), d);
      g.all_reduce(t, op);
      EXPECT_EQ(t.dtype(), d);
      expect_close(t, reduced_reference({5, 7}, d, op, g.size()),
                   tolerance(d), fmt::format("all_reduce {} {}", reduce_op_name(op), dtype_name(d)));
    }
}

TEST(ProcessGroup, Bf16AllReduceSumsInF32) {
  // 256 + 1 + 1 + ... : bf16 steps are 2 above 256, so adding the ones one at a
  // time in bf16 would stay at 256; summing in f32 and rounding once does not.
  ProcessGroup& g = world();
  Tensor t = Tensor::full({3}, g.rank() == 0 ? 256.0 : 1.0, DType::BF16);
  g.all_reduce(t, ReduceOp::Sum);
  float exact = 256.f + static_cast<float>(g.size() - 1);
  EXPECT_EQ(t.to_vector()[0], to_f32(to_bf16(exact)));
}

TEST(ProcessGroup, AllGatherEveryDimAndDtype) {
  ProcessGroup& g = world();
  for (DType d : kDtypes)
    for (int64_t dim : {0, 1, -1}) {
      Shape shape{3, 2, 4};
      Tensor out = g.all_gather(rank_input(shape, g.rank(), d), dim);
      std::vector<Tensor> all;
      for (int r = 0; r < g.size(); ++r) all.push_back(rank_input(shape, r, d));
      expect_close(out, cat(all, dim), 0, label("all_gather", d, dim));
    }
}

TEST(ProcessGroup, AllGatherUnevenIncludingEmptyPieces) {
  ProcessGroup& g = world();
  for (DType d : kDtypes)
    for (int64_t dim : {0, 1}) {
      auto shape_of = [&](int r) {
        Shape s{2, 3};
        s[dim] = r % 3;  // rank 0 holds nothing
        return s;
      };
      std::vector<int64_t> sizes;
      Tensor out = g.all_gather_uneven(rank_input(shape_of(g.rank()), g.rank(), d), dim, &sizes);
      std::vector<Tensor> all;
      for (int r = 0; r < g.size(); ++r) {
        all.push_back(rank_input(shape_of(r), r, d));
        if (static_cast<int>(sizes.size()) == g.size()) {
          EXPECT_EQ(sizes[r], r % 3);
        }
      }
      EXPECT_EQ(static_cast<int>(sizes.size()), g.size());
      expect_close(out, cat(all, dim), 0, label("all_gather_uneven", d, dim));
    }
}

TEST(ProcessGroup, ReduceScatterUnevenEveryOpDimAndDtype) {
  ProcessGroup& g = world();
  for (DType d : kDtypes)
    for (ReduceOp op : kOps)
      for (int64_t dim : {0, 1, -1}) {
        Shape shape{10, 3, 2};  // 10 rows over 4 ranks: 3, 3, 3, 1
        if (dim != 0) shape = {2, 10, 3};
        if (dim == -1) shape = {2, 3, 2};  // a dim smaller than the world size
        Tensor out = g.reduce_scatter(rank_input(shape, g.rank(), d), dim, op);
        int64_t dd = normalize_dim(dim, 3);
        ChunkSpan span = chunk_span(shape[dd], g.size(), g.rank());
        Tensor want = reduced_reference(shape, d, op, g.size()).narrow(dd, span.offset, span.size);
        expect_close(out, want, tolerance(d),
                     fmt::format("reduce_scatter {} {} dim {}", reduce_op_name(op), dtype_name(d), dim));
      }
}

// The in-place all-gather of data parallelism's weight slabs, every dtype:
// uneven pieces (13 over up to 4 ranks, and a buffer smaller than the group),
// and one above the 8 MiB a round moves (several rounds).
TEST(ProcessGroup, AllGatherInPlaceFillsInEveryRanksPiece) {
  ProcessGroup& g = world();
  for (int64_t n : {int64_t{13}, int64_t{2}, int64_t{5} << 20})
    for (DType d : kDtypes) {
      if (n > 13 && d != DType::F32) continue;
      Tensor want = rank_input({n}, 0, d), full = Tensor::zeros({n}, d);
      const ChunkSpan span = chunk_span(n, g.size(), g.rank());
      if (span.size > 0) full.narrow(0, span.offset, span.size).copy_from(want.narrow(0, span.offset, span.size));
      g.all_gather_in_place(full);
      expect_close(full, want, 0, fmt::format("all_gather_in_place of {} {}", n, dtype_name(d)));
    }
  EXPECT_THROW(g.all_gather_in_place(Tensor::zeros({2, 2})), Error) << "only flat buffers";
}

// An all-reduce above 8 MiB runs in pieces: the sum is the serial one throughout.
TEST(ProcessGroup, LargeAllReduceInPiecesMatchesTheSerialSum) {
  ProcessGroup& g = world();
  const Shape shape{(int64_t{5} << 20) + 7};  // 20 MiB of f32 and a tail: three pieces, the last short
  for (DType d : {DType::F32, DType::BF16}) {
    Tensor t = rank_input(shape, g.rank(), d);
    g.all_reduce(t);
    expect_close(t, reduced_reference(shape, d, ReduceOp::Sum, g.size()), tolerance(d),
                 fmt::format("all_reduce of {} {}", shape[0], dtype_name(d)));
  }
}

TEST(ProcessGroup, BroadcastFromLastRank) {
  ProcessGroup& g = world();
  for (DType d : kDtypes) {
    Tensor t = rank_input({4, 5}, g.rank(), d);
    g.broadcast(t, g.size() - 1);
    expect_close(t, rank_input({4, 5}, g.size() - 1, d), 0, label("broadcast", d));
  }
  Tensor t = Tensor::zeros({1});
  EXPECT_THROW(g.broadcast(t, g.size()), Error);
}

// Runs `collective` on every rank after rank 0 has slept 300 ms, and checks that
// the others slept too while they waited: under a third of a core.
void waits_without_spinning(const std::string& what, const std::function<void()>& collective) {
  ProcessGroup& g = world();
  auto thread_cpu_s = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  };
  g.barrier();  // start together: a rank descheduled before the collective must not shorten its wait
  if (g.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto wall0 = std::chrono::steady_clock::now();
  const double cpu0 = thread_cpu_s();
  collective();
  const double cpu = thread_cpu_s() - cpu0;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  if (g.rank() == 0) return;
  // Rank 0 came 300 ms late, so every other rank waited for it.
  EXPECT_GT(wall, 0.15) << what << ": rank " << g.rank() << " did not wait for the late root";
  EXPECT_LT(cpu, 0.3 * wall) << what << ": rank " << g.rank() << " used " << cpu << " s of CPU in a " << wall
                             << " s wait";
}

// A rank waiting in broadcast_idle for a root that takes its time sleeps
// rather than spinning: it uses a small part of a core while it waits.
TEST(ProcessGroup, BroadcastIdleWaitsWithoutSpinning) {
  ProcessGroup& g = world();
  for (DType d : kDtypes) {
    Tensor t = rank_input({3, 7}, g.rank(), d);
    waits_without_spinning(label("broadcast_idle", d), [&] { g.broadcast_idle(t, 0); });
    expect_close(t, rank_input({3, 7}, 0, d), 0, label("broadcast_idle", d));
  }
  Tensor t = Tensor::zeros({1});
  EXPECT_THROW(g.broadcast_idle(t, g.size()), Error);
}

// Decode's small all-reduces and all-gathers wait the same way for a peer the
// kernel has descheduled (another process wanted its core), instead of holding
// this rank's core through the peer's time slice.
TEST(ProcessGroup, SmallAllReduceAndAllGatherWaitWithoutSpinning) {
  ProcessGroup& g = world();
  if (g.size() == 1) return;
  for (DType d : {DType::F32, DType::BF16}) {
    Tensor t = rank_input({4, 1024}, g.rank(), d);
    waits_without_spinning(label("all_reduce", d), [&] { g.all_reduce(t, ReduceOp::Sum); });
    expect_close(t, reduced_reference({4, 1024}, d, ReduceOp::Sum, g.size()), tolerance(d), label("sum", d));
    const Tensor mine = rank_input({2, 512}, g.rank(), d);
    Tensor gathered;
    waits_without_spinning(label("all_gather", d), [&] { gathered = g.all_gather(mine, 0); });
    std::vector<Tensor> every;
    for (int r = 0; r < g.size(); ++r) every.push_back(rank_input({2, 512}, r, d));
    expect_close(gathered, cat(every, 0), 0, label("all_gather", d));
  }
}

TEST(ProcessGroup, AllToAllUnevenSplitAndConcat) {
  ProcessGroup& g = world();
  for (DType d : kDtypes)
    for (auto [split, concat] : {std::pair<int64_t, int64_t>{0, 1}, {1, 0}, {1, 2}, {0, 0}}) {
      // Rank r: 10 along split_dim (chunk rule), r + 1 along concat_dim.
      auto shape_of = [&](int r) {
        Shape s{4, 3, 2};
        s[split] = 10;
        if (concat != split) s[concat] = r + 1;
        return s;
      };
      Tensor out = g.all_to_all(rank_input(shape_of(g.rank()), g.rank(), d), split, concat);
      std::vector<Tensor> pieces;
      for (int r = 0; r < g.size(); ++r) {
        Tensor in = rank_input(shape_of(r), r, d);
        ChunkSpan span = chunk_span(in.shape()[split], g.size(), g.rank());
        pieces.push_back(in.narrow(split, span.offset, span.size).clone());
      }
      expect_close(out, cat(pieces, concat), 0,
                   fmt::format("all_to_all {} split {} concat {}", dtype_name(d), split, concat));
    }
}

TEST(ProcessGroup, AllToAllVSendsRowsByCountIncludingNone) {
  ProcessGroup& g = world();
  const int n = g.size();
  // Rank r sends (r + j) % 3 rows to rank j (some counts 0): rows of [?, 3, 2].
  auto counts_of = [&](int r) {
    std::vector<int64_t> c(n);
    for (int j = 0; j < n; ++j) c[j] = (r + j) % 3;
    return c;
  };
  for (DType d : kDtypes) {
    auto input_of = [&](int r) {
      int64_t rows = 0;
      for (int64_t c : counts_of(r)) rows += c;
      return rank_input({rows, 3, 2}, r, d);
    };
    std::vector<int64_t> got_counts;
    Tensor out = g.all_to_all_v(input_of(g.rank()), counts_of(g.rank()), &got_counts);
    std::vector<Tensor> pieces;
    std::vector<int64_t> want_counts;
    for (int r = 0; r < n; ++r) {
      std::vector<int64_t> c = counts_of(r);
      int64_t start = 0;
      for (int j = 0; j < g.rank(); ++j) start += c[j];
      pieces.push_back(input_of(r).narrow(0, start, c[g.rank()]).clone());
      want_counts.push_back(c[g.rank()]);
    }
    EXPECT_EQ(got_counts, want_counts);
    expect_close(out, cat(pieces, 0), 0, fmt::format("all_to_all_v {}", dtype_name(d)));
  }
  // Counts that do not add up to the rows are an error on the rank that passed them, before any exchange.
  if (n == 1) {
    try {
      g.all_to_all_v(Tensor::zeros({3, 2}), {2});
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("send counts add up to 2 rows, the input has 3"), std::string::npos)
          << e.what();
    }
  }
}

TEST(ProcessGroup, MismatchedShapesAreAnErrorNotAHang) {
  ProcessGroup& g = world();
  if (g.size() == 1) GTEST_SKIP() << "needs two ranks";
  // Ranks disagree in rank-of-tensor: every rank detects it from the shape exchange.
  Tensor t = g.rank() == 0 ? Tensor::zeros({2, 2}) : Tensor::zeros({2, 2, 1});
  EXPECT_THROW(g.all_gather_uneven(t, 0), Error);
  g.barrier();
}

TEST(ProcessGroup, SteadyStateCollectivesDoNotAllocate) {
  ProcessGroup& g = world();
  Tensor x = rank_input({64, 1024}, g.rank(), DType::BF16);
  auto round = [&] {
    Tensor t = x.clone();
    g.all_reduce(t);
    Tensor rs = g.reduce_scatter(x, 1);
    Tensor ag = g.all_gather_uneven(rs, 1);
    Tensor a2a = g.all_to_all(x, 1, 0);
  };
  for (int i = 0; i < 3; ++i) round();
  size_t before = allocator_stats().system_allocations;
  for (int i = 0; i < 10; ++i) round();
  EXPECT_EQ(allocator_stats().system_allocations, before);
}

TEST(ProcessGroup, SplitMakesIndependentGroups) {
  ProcessGroup& g = world();
  // Even and odd ranks: the sum of world ranks within each group.
  auto sub = g.split(g.rank() % 2, g.rank());
  Tensor t = Tensor::from_ints({g.rank()}, {1}, DType::I64);
  sub->all_reduce(t);
  int64_t want = 0;
  for (int r = g.rank() % 2; r < g.size(); r += 2) want += r;
  EXPECT_EQ(static_cast<int64_t>(t.item()), want);
  EXPECT_EQ(sub->rank(), g.rank() / 2);
}

}  // namespace
}  // namespace tp::dist
