// GoogleTest main for multi-rank suites (run under mpirun by CTest).
// Rank 0 prints the usual report; other ranks print only their failures, tagged
// with the rank. The exit code is non-zero on every rank when any rank failed.
// A watchdog aborts the job if a suite runs past TP_TEST_TIMEOUT seconds (a
// collective waiting on a rank that skipped it must not hang CTest).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "tp/distributed/process_group.h"

namespace {

class RankFailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] FAILED %s:%d\n%s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                   r.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  tp::dist::init(&argc, &argv);
  testing::InitGoogleTest(&argc, argv);
  // An unexpected exception on one rank would leave the others blocked in the
  // next collective: let it reach the terminate handler, which aborts the job.
  GTEST_FLAG_SET(catch_exceptions, false);
  int rank = tp::dist::world_rank();
  if (rank != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  int timeout_s = 120;
  if (const char* t = std::getenv("TP_TEST_TIMEOUT")) timeout_s = std::atoi(t);
  std::thread([timeout_s] {
    std::this_thread::sleep_for(std::chrono::seconds(timeout_s));
    tp::dist::abort_job("test watchdog: still running after " + std::to_string(timeout_s) +
                        " s (a rank is probably waiting in a collective another rank skipped)");
  }).detach();

  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  tp::Tensor flag = tp::Tensor::from_ints({failed}, {1}, tp::DType::I32);
  tp::dist::world().all_reduce(flag, tp::dist::ReduceOp::Max);
  int any = static_cast<int>(flag.item());
  if (any && rank == 0) std::fprintf(stderr, "some rank failed (see [rank r] FAILED lines above)\n");
  return any;
}
