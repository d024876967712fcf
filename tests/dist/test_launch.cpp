// tprun's command line -> mpirun command line (no processes started).
#include <gtest/gtest.h>

#include <algorithm>

#include "tp/dist/launch.h"
#include "tp/tensor/error.h"

namespace tp::dist {
namespace {

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

TEST(Launch, ParsesFlagsUntilTheProgram) {
  auto o = parse_launch_args({"--nproc-per-node", "4", "--nnodes=2", "--node-rank", "1", "prog", "--nnodes", "x"});
  EXPECT_EQ(o.nproc_per_node, 4);
  EXPECT_EQ(o.nnodes, 2);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.command, (std::vector<std::string>{"prog", "--nnodes", "x"}));
}

TEST(Launch, BadFlagsAreUsageErrors) {
  EXPECT_THROW(parse_launch_args({"--nproc-per-node", "0", "prog"}), UsageError);
  EXPECT_THROW(parse_launch_args({"--nproc-per-node", "two", "prog"}), UsageError);
  EXPECT_THROW(parse_launch_args({"--nprocs", "2", "prog"}), UsageError);
  EXPECT_THROW(parse_launch_args({"--nproc-per-node", "2"}), UsageError);
  EXPECT_THROW(parse_launch_args({"--nnodes", "2", "--node-rank", "2", "prog"}), UsageError);
}

TEST(Launch, RootOversubscriptionThreadsAndTrampoline) {
  auto o = parse_launch_args({"--nproc-per-node", "4", "prog", "a"});
  LaunchPlan p = plan_launch(o, "mpirun", "/bin/tprun", 2, true, "");
  EXPECT_TRUE(contains(p.argv, "--allow-run-as-root"));
  EXPECT_TRUE(contains(p.argv, "--oversubscribe"));
  EXPECT_EQ(p.env["OMP_NUM_THREADS"], "1");
  EXPECT_EQ(p.env["GLIBC_TUNABLES"], "glibc.malloc.hugetlb=1");
  std::vector<std::string> tail(p.argv.end() - 4, p.argv.end());
  EXPECT_EQ(tail, (std::vector<std::string>{"/bin/tprun", "--exec-rank", "prog", "a"}));
  EXPECT_EQ(*(std::find(p.argv.begin(), p.argv.end(), "-np") + 1), "4");

  LaunchPlan q = plan_launch(parse_launch_args({"--nproc-per-node", "2", "prog"}), "mpirun", "t", 16, false, "3");
  EXPECT_FALSE(contains(q.argv, "--allow-run-as-root"));
  EXPECT_FALSE(contains(q.argv, "--oversubscribe"));
  EXPECT_EQ(q.env["OMP_NUM_THREADS"], "3");  // the user's setting wins
  EXPECT_EQ(plan_launch(parse_launch_args({"--nproc-per-node", "2", "p"}), "m", "t", 16, false, "").env["OMP_NUM_THREADS"],
            "8");
}

TEST(Launch, MultiNodeRunsFromNodeZeroWithAHostfile) {
  auto o = parse_launch_args({"--nproc-per-node", "2", "--nnodes", "3", "--hostfile", "hosts", "prog"});
  LaunchPlan p = plan_launch(o, "mpirun", "t", 8, false, "");
  EXPECT_EQ(*(std::find(p.argv.begin(), p.argv.end(), "-np") + 1), "6");
  EXPECT_TRUE(contains(p.argv, "ppr:2:node"));
  EXPECT_TRUE(contains(p.argv, "hosts"));
  o.node_rank = 1;
  EXPECT_FALSE(plan_launch(o, "mpirun", "t", 8, false, "").note.empty());
  EXPECT_THROW(plan_launch(parse_launch_args({"--nnodes", "2", "prog"}), "mpirun", "t", 8, false, ""), UsageError);
}

TEST(Launch, RankEnvironmentFromOpenMpi) {
  auto env = rank_environment({{"OMPI_COMM_WORLD_RANK", "5"},
                               {"OMPI_COMM_WORLD_SIZE", "8"},
                               {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                               {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  EXPECT_EQ(env["RANK"], "5");
  EXPECT_EQ(env["WORLD_SIZE"], "8");
  EXPECT_EQ(env["LOCAL_RANK"], "1");
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "4");
  EXPECT_THROW(rank_environment({}), Error);
}

}  // namespace
}  // namespace tp::dist
