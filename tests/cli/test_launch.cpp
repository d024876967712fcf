// tprun's command line -> mpirun command line (no processes started), and the
// rendezvous of several nodes' tprun over loopback sockets.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <thread>

#include "tp/cli/tprun/launch.h"
#include "tp/cli/tprun/rendezvous.h"
#include "tp/core/error.h"

namespace tp::launcher {
namespace {

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// The value after `flag` in argv ("" when absent).
std::string after(const std::vector<std::string>& argv, const std::string& flag) {
  auto it = std::find(argv.begin(), argv.end(), flag);
  return it == argv.end() || it + 1 == argv.end() ? "" : *(it + 1);
}

LaunchHost host(int cores, bool root = false, std::string omp = "", std::string rundir = "") {
  return {.mpirun = "mpirun", .self = "/bin/tprun", .cores = cores, .root = root, .omp_threads_env = omp,
          .rundir = rundir};
}

// The message of the E that f throws.
template <class E = Error>
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no error)";
}

std::string usage_error(const std::vector<std::string>& args) {
  return error_of<UsageError>([&] { parse_launch_args(args); });
}

TEST(Launch, ParsesFlagsUntilTheProgram) {
  auto o = parse_launch_args(
      {"--nproc-per-node", "4", "--nnodes=2", "--node-rank", "1", "--master-addr", "h", "prog", "--nnodes", "x"});
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

TEST(Launch, ALoadedMachineGetsThreadsForItsFreeCoresAndAWarning) {
  LaunchHost busy = host(8);
  busy.busy_cores = 4;
  LaunchPlan one = plan_launch(parse_launch_args({"--nproc-per-node", "2", "p"}), busy);
  EXPECT_EQ(one.env["OMP_NUM_THREADS"], "2");  // 4 free cores for 2 ranks, not 8
  EXPECT_EQ(one.env["TPRUN_BUSY_CORES"], "4");
  EXPECT_TRUE(one.warning.empty());  // a core per rank is free
  busy = host(2);
  busy.busy_cores = 1;
  LaunchPlan two = plan_launch(parse_launch_args({"--nproc-per-node", "2", "p"}), busy);
  EXPECT_EQ(two.env["OMP_NUM_THREADS"], "1");
  EXPECT_NE(two.warning.find("keep 1 of this machine's 2 cores busy"), std::string::npos) << two.warning;
  EXPECT_NE(two.warning.find("--nproc-per-node 1"), std::string::npos) << two.warning;
  busy.busy_cores = 2;  // every core: still one thread per rank, never 0
  EXPECT_EQ(plan_launch(parse_launch_args({"--nproc-per-node", "1", "p"}), busy).env["OMP_NUM_THREADS"], "1");
  EXPECT_EQ(plan_launch(parse_launch_args({"--nproc-per-node", "1", "p"}), host(4, false, "3")).env["OMP_NUM_THREADS"],
            "3");  // the user's setting wins
  EXPECT_TRUE(plan_launch(parse_launch_args({"--nproc-per-node", "2", "p"}), host(2)).warning.empty());
}

TEST(Launch, RootOversubscriptionThreadsAndTrampoline) {
  auto o = parse_launch_args({"--nproc-per-node", "4", "prog", "a"});
  LaunchPlan p = plan_launch(o, host(2, true));
  EXPECT_TRUE(contains(p.argv, "--allow-run-as-root"));
  EXPECT_TRUE(contains(p.argv, "--oversubscribe"));
  EXPECT_EQ(p.env["OMP_NUM_THREADS"], "1");
  EXPECT_EQ(p.env["GLIBC_TUNABLES"], "glibc.malloc.hugetlb=1");
  std::vector<std::string> tail(p.argv.end() - 4, p.argv.end());
  EXPECT_EQ(tail, (std::vector<std::string>{"/bin/tprun", "--exec-rank", "prog", "a"}));
  EXPECT_EQ(*(std::find(p.argv.begin(), p.argv.end(), "-np") + 1), "4");

  LaunchPlan q = plan_launch(parse_launch_args({"--nproc-per-node", "2", "prog"}), host(16, false, "3"));
  EXPECT_FALSE(contains(q.argv, "--allow-run-as-root"));
  EXPECT_FALSE(contains(q.argv, "--oversubscribe"));
  EXPECT_EQ(q.env["OMP_NUM_THREADS"], "3");  // the user's setting wins
  EXPECT_EQ(plan_launch(parse_launch_args({"--nproc-per-node", "2", "p"}), host(16)).env["OMP_NUM_THREADS"], "8");
  EXPECT_EQ(p.env["NODE_RANK"], "0");
  EXPECT_TRUE(contains(p.argv, "NODE_RANK"));  // one node: forwarded with -x as before
  EXPECT_FALSE(contains(p.argv, "--hostfile"));
}

// Concurrent jobs must not share Open MPI's session directory: one job's
// cleanup removes it under another one starting (open-mpi/ompi#8510).
TEST(Launch, EachJobHasItsOwnMpiSessionDirectory) {
  auto o = parse_launch_args({"--nproc-per-node", "2", "prog"});
  LaunchPlan p = plan_launch(o, host(2, false, "", "/dev/shm/tprun-a"));
  EXPECT_EQ(p.env["OMPI_MCA_orte_tmpdir_base"], "/dev/shm/tprun-a");
  EXPECT_TRUE(contains(p.argv, "OMPI_MCA_orte_tmpdir_base"));
  EXPECT_EQ(p.env.count("OMPI_MCA_btl_vader_backing_directory"), 0u);  // one node: the default is private enough
}

// A decode step's all-reduces (a hidden state in f32, 4-16 KiB) go through shared memory's eager path rather than
// a system call each; a limit the caller set wins.
TEST(Launch, SmallMessagesTakeSharedMemorysEagerPath) {
  auto o = parse_launch_args({"--nproc-per-node", "2", "prog"});
  LaunchPlan p = plan_launch(o, host(2));
  EXPECT_EQ(p.env["OMPI_MCA_btl_vader_eager_limit"], "32768");
  EXPECT_TRUE(contains(p.argv, "OMPI_MCA_btl_vader_eager_limit"));
  LaunchHost mine = host(2);
  mine.eager_limit_env = "8192";
  EXPECT_EQ(plan_launch(o, mine).env["OMPI_MCA_btl_vader_eager_limit"], "8192");
}

TEST(Launch, MultiNodeRunsFromNodeZeroWithAHostfile) {
  auto o = parse_launch_args({"--nproc-per-node", "2", "--nnodes", "3", "--hostfile", "hosts", "prog"});
  LaunchPlan p = plan_launch(o, host(8));
  EXPECT_EQ(after(p.argv, "-np"), "6");
  EXPECT_EQ(after(p.argv, "--map-by"), "ppr:2:node");
  EXPECT_EQ(after(p.argv, "--hostfile"), "hosts");
  EXPECT_FALSE(contains(p.argv, "plm_rsh_agent"));  // mpirun's own ssh
  o.node_rank = 1;
  EXPECT_FALSE(plan_launch(o, host(8)).note.empty());
}

TEST(Launch, MultiNodeFlagErrorsNameTheFlag) {
  EXPECT_NE(usage_error({"--nnodes", "2", "prog"}).find("--nnodes 2 needs --master-addr A"), std::string::npos);
  EXPECT_NE(usage_error({"--nnodes", "2", "--node-rank", "2", "--master-addr", "h", "prog"})
                .find("--node-rank 2 must be below --nnodes 2"),
            std::string::npos);
  EXPECT_NE(usage_error({"--master-port", "70000", "prog"}).find("--master-port 70000 is above 65535"),
            std::string::npos);
  EXPECT_NE(usage_error({"--master-port", "0", "prog"}).find("--master-port expects an integer >= 1"),
            std::string::npos);
  EXPECT_NE(usage_error({"--join-timeout", "-1", "prog"}).find("--join-timeout expects a number of seconds > 0"),
            std::string::npos);
  auto o = parse_launch_args({"--nnodes=2", "--node-rank=1", "--master-addr=10.0.0.1", "--master-port=1234",
                              "--join-timeout=2.5", "prog"});
  EXPECT_TRUE(o.rendezvous());
  EXPECT_EQ(o.master_port, 1234);
  EXPECT_DOUBLE_EQ(o.join_timeout_s, 2.5);
  EXPECT_EQ(parse_launch_args({"--nnodes", "2", "--master-addr", "h", "prog"}).master_port, 29500);
}

// Node 0 of a rendezvous: one mpirun over every node, each reached through tprun's agent.
TEST(Launch, RendezvousNodeZeroRunsOneMpirunOverEveryNode) {
  auto o = parse_launch_args(
      {"--nproc-per-node", "2", "--nnodes", "3", "--master-addr", "127.0.0.1", "--master-port", "4000", "prog", "x"});
  LaunchPlan p = plan_launch(o, host(8, true, "", "/run/d"));
  EXPECT_EQ(after(p.argv, "-np"), "6");
  EXPECT_EQ(after(p.argv, "--hostfile"), "/run/d/hostfile");
  EXPECT_EQ(p.hostfile_path, "/run/d/hostfile");
  EXPECT_EQ(p.hostfile, "localhost slots=2\ntprun-node-1 slots=2\ntprun-node-2 slots=2\n");
  EXPECT_EQ(after(p.argv, "plm_rsh_agent"), "/bin/tprun --rsh-agent");
  EXPECT_EQ(after(p.argv, "plm_rsh_no_tree_spawn"), "1");
  EXPECT_TRUE(contains(p.argv, "--leave-session-attached"));
  EXPECT_EQ(after(p.argv, "btl_tcp_if_include"), "lo");  // a loopback master: every node is this machine
  EXPECT_FALSE(contains(p.argv, "-x"));  // each node's ranks keep their own node's variables
  EXPECT_EQ(p.env[kAgentSocketEnv], "/run/d/agent.sock");
  EXPECT_EQ(p.env["MASTER_ADDR"], "127.0.0.1");
  EXPECT_EQ(p.env["MASTER_PORT"], "4000");
  EXPECT_EQ(p.env["NODE_RANK"], "0");
  std::vector<std::string> tail(p.argv.end() - 4, p.argv.end());
  EXPECT_EQ(tail, (std::vector<std::string>{"/bin/tprun", "--exec-rank", "prog", "x"}));

  o.master_addr = "node0.cluster";
  EXPECT_FALSE(contains(plan_launch(o, host(8, false, "", "/run/d")).argv, "btl_tcp_if_include"));
}

// Other nodes start no mpirun: their tprun runs the daemon node 0 sends, with this node's variables.
TEST(Launch, RendezvousOtherNodesOnlySetTheirEnvironment) {
  auto o = parse_launch_args({"--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr",
                              "127.0.0.1", "prog"});
  LaunchPlan p = plan_launch(o, host(4, false, "", "/dev/shm/tprun-x"));
  EXPECT_TRUE(p.argv.empty());
  EXPECT_TRUE(p.note.empty());
  EXPECT_EQ(p.env["NODE_RANK"], "1");
  EXPECT_EQ(p.env["GROUP_RANK"], "1");
  EXPECT_EQ(p.env["OMP_NUM_THREADS"], "2");
  EXPECT_EQ(p.env["MASTER_PORT"], "29500");
  // Two "nodes" on one machine must not share MPI's shared-memory segment names.
  EXPECT_EQ(p.env["OMPI_MCA_btl_vader_backing_directory"], "/dev/shm/tprun-x");
  EXPECT_EQ(p.env["OMPI_MCA_orte_tmpdir_base"], "/dev/shm/tprun-x");
  EXPECT_THROW(plan_launch(o, host(4)), Error);  // no run directory
}

TEST(Launch, NodeHostNames) {
  EXPECT_EQ(node_host_name(0), "localhost");
  EXPECT_EQ(node_host_name(12), "tprun-node-12");
  EXPECT_EQ(node_of_host("tprun-node-12"), 12);
  EXPECT_THROW(node_of_host("tprun-node-"), Error);
  EXPECT_THROW(node_of_host("tprun-node-1x"), Error);
  EXPECT_THROW(node_of_host("otherhost"), Error);
}

LaunchOptions node(int rank, int nnodes, int port, double timeout_s) {
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.nnodes = nnodes;
  o.node_rank = rank;
  o.master_addr = "127.0.0.1";
  o.master_port = port;
  o.join_timeout_s = timeout_s;
  return o;
}

TEST(Rendezvous, NodesJoinNodeZero) {
  int listener = listen_tcp(0);
  int port = bound_port(listener);
  std::vector<Channel> joined(3);
  std::thread t1([&] { joined[1] = join_job(node(1, 3, port, 10)); });
  std::thread t2([&] { joined[2] = join_job(node(2, 3, port, 10)); });
  std::vector<Channel> nodes = gather_nodes(listener, node(0, 3, port, 10));
  t1.join();
  t2.join();
  close(listener);
  ASSERT_EQ(nodes.size(), 3u);
  EXPECT_FALSE(nodes[0].is_open());
  // Each channel reaches the node that joined with that rank.
  for (int r = 1; r < 3; ++r) {
    ASSERT_TRUE(nodes[r].send(fmt::format("start {}", r)));
    EXPECT_EQ(joined[r].next_line(5).value_or("none"), fmt::format("start {}", r));
  }
  EXPECT_EQ(split_message("start a b"), (std::pair<std::string, std::string>{"start", "a b"}));
}

TEST(Rendezvous, MissingNodesTimeOutNamingThem) {
  int listener = listen_tcp(0);
  int port = bound_port(listener);
  Channel one;
  std::thread t1([&] { one = join_job(node(1, 3, port, 10)); });
  std::string message = error_of([&] { gather_nodes(listener, node(0, 3, port, 0.5)); });
  t1.join();
  close(listener);
  EXPECT_NE(message.find(fmt::format("2 of 3 nodes joined at 127.0.0.1:{} within 0.5 s; missing node ranks: 2", port)),
            std::string::npos)
      << message;
  // The node that joined hears why.
  EXPECT_EQ(one.next_line(5).value_or("none"), "error " + message);
}

TEST(Rendezvous, NodeZeroAbsentOrDifferentSizes) {
  int listener = listen_tcp(0);
  int port = bound_port(listener);
  close(listener);  // nobody listens there now
  std::string absent = error_of([&] { join_job(node(1, 2, port, 0.3)); });
  EXPECT_NE(absent.find(fmt::format("node 1: node 0's tprun: nobody answered at 127.0.0.1:{} within 0.3 s", port)),
            std::string::npos)
      << absent;

  listener = listen_tcp(0);
  port = bound_port(listener);
  std::string refused;
  std::thread t1([&] { refused = error_of([&] { join_job(node(1, 3, port, 10)); }); });
  std::string message = error_of([&] { gather_nodes(listener, node(0, 2, port, 10)); });
  t1.join();
  close(listener);
  EXPECT_NE(message.find("node 1 was started with --nnodes 3 --nproc-per-node 2 but node 0 with --nnodes 2"),
            std::string::npos)
      << message;
  EXPECT_EQ(refused, message);
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
}  // namespace tp::launcher
