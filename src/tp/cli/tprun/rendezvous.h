#pragma once
// How the tprun of several nodes find each other (tp/cli/tprun/launch.h has the
// design): node 0 listens at --master-addr:--master-port, every other node
// connects and joins; then they talk in lines over that connection until the
// job ends. The messages (one per line, "verb rest"):
//   node R -> node 0   join v1 <node_rank> <nnodes> <nproc_per_node>
//   node 0 -> node R   ok | error <message>        (the join's answer)
//   node 0 -> node R   start <shell command>       (OpenMPI's daemon for node R)
//   node R -> node 0   exited <status>             (that daemon ended)
//   node 0 -> node R   done <exit code>            (mpirun ended: the job's exit code)
//   node 0 -> node R   error <message>             (the job cannot start)
// and between node 0's mpirun agent and node 0's tprun (a Unix socket):
//   agent -> tprun     launch <host> <shell command>
//   tprun -> agent     exited <status>
// A connection that closes before "done" means that side died: the job ends.
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tp/cli/tprun/launch.h"

namespace tp::launcher {

// A connected stream socket carrying one message per line. Move-only; closes on destruction.
class Channel {
 public:
  Channel() = default;
  explicit Channel(int fd, std::string peer = "");
  Channel(Channel&& other) noexcept;
  Channel& operator=(Channel&& other) noexcept;
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;
  ~Channel() { close(); }

  bool is_open() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  const std::string& peer() const { return peer_; }  // "addr:port", for messages

  // Sends one line (without '\n'); false when the peer is gone (never SIGPIPE).
  bool send(const std::string& line);
  // Reads what has arrived (call when poll says readable) and appends the
  // complete lines; false at EOF or on an error (the channel is then closed).
  bool receive(std::vector<std::string>& lines);
  // Waits up to timeout_s for the next line; nullopt on timeout or when the
  // channel closed (is_open() tells which).
  std::optional<std::string> next_line(double timeout_s);
  void close();

 private:
  int fd_ = -1;
  std::string peer_;
  std::string pending_;          // bytes of an incomplete line
  std::vector<std::string> queued_;  // complete lines not yet returned by next_line
};

// "verb rest" -> {verb, rest}.
std::pair<std::string, std::string> split_message(const std::string& line);

// A TCP socket listening on every IPv4 interface at `port` (0: a free one);
// throws Error naming the port when it is taken.
int listen_tcp(int port);
int bound_port(int listen_fd);
// `tick`, where these functions take one, runs every 100-200 ms while they wait
// and may throw to end the wait (tprun: on a signal).
using Tick = std::function<void()>;

// Connects to host:port, retrying while nobody listens there until timeout_s;
// then returns a closed channel, with the last reason in *why.
Channel connect_tcp(const std::string& host, int port, double timeout_s, std::string* why, const Tick& tick = {});
int listen_unix(const std::string& path);
Channel connect_unix(const std::string& path);
Channel accept_channel(int listen_fd);

// Node 0: accepts the other nodes' tprun until all nnodes - 1 have joined with
// node 0's --nnodes and --nproc-per-node, and returns their channels indexed by
// node rank (entry 0 unused). Throws Error naming the address and port, how many
// nodes joined and which are missing when join_timeout_s passes first (or what
// differs for a node started with other sizes); the nodes that joined get the
// same message.
std::vector<Channel> gather_nodes(int listen_fd, const LaunchOptions& options, const Tick& tick = {});
// Node R > 0: connects to node 0 (retrying until join_timeout_s) and joins;
// throws Error when nobody answers there or node 0 refuses.
Channel join_job(const LaunchOptions& options, const Tick& tick = {});

}  // namespace tp::launcher
