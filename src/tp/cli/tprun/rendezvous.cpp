#include "tp/cli/tprun/rendezvous.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "tp/core/error.h"

namespace tp::launcher {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string errno_text() { return std::strerror(errno); }

// A dead peer (its machine gone, not just its process) is noticed in ~25 s
// instead of TCP's two hours.
void keep_alive(int fd) {
  int on = 1, idle = 10, interval = 5, count = 3;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
}

std::string peer_name(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
  } else {
    return "local";
  }
  return fmt::format("{}:{}", host, port);
}

// A connect that gives up after timeout_ms (a blocking one waits minutes for a
// host that drops packets); the socket is left blocking.
bool connect_within(int fd, const sockaddr* addr, socklen_t len, int timeout_ms, std::string* why) {
  int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  int rc = connect(fd, addr, len);
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    int error = ETIMEDOUT;
    socklen_t size = sizeof(error);
    if (poll(&p, 1, timeout_ms) > 0) getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size);
    errno = error;
    rc = error == 0 ? 0 : -1;
  }
  if (rc != 0) *why = errno_text();
  fcntl(fd, F_SETFL, flags);
  return rc == 0;
}

sockaddr_un unix_address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  TP_CHECK(path.size() < sizeof(addr.sun_path), "socket path '{}' is longer than {} bytes", path,
           sizeof(addr.sun_path) - 1);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

std::string join_line(const LaunchOptions& o) {
  return fmt::format("join v1 {} {} {}", o.node_rank, o.nnodes, o.nproc_per_node);
}

// Who is still missing, for the timeout message: "1, 3".
std::string missing_ranks(const std::vector<Channel>& nodes) {
  std::vector<int> missing;
  for (size_t r = 1; r < nodes.size(); ++r)
    if (!nodes[r].is_open()) missing.push_back(static_cast<int>(r));
  return fmt::format("{}", fmt::join(missing, ", "));
}

[[noreturn]] void fail_all(std::vector<Channel>& nodes, const std::string& message) {
  for (Channel& c : nodes)
    if (c.is_open()) c.send("error " + message);
  throw Error(message);
}

// Node 0's answer to one "join" line: the node rank it joined as, or -1 (and
// the reason in *refusal) when the line is not a tprun of this job.
int check_join(const std::string& line, const std::string& from, const LaunchOptions& o,
               const std::vector<Channel>& nodes, std::string* refusal) {
  int rank = -1, nnodes = -1, nproc = -1;
  char version[8] = "";
  if (std::sscanf(line.c_str(), "join %7s %d %d %d", version, &rank, &nnodes, &nproc) != 4 ||
      std::strcmp(version, "v1") != 0) {
    *refusal = "";  // not tprun (a port scanner, another program): drop it quietly
    return -1;
  }
  if (nnodes != o.nnodes || nproc != o.nproc_per_node)
    *refusal = fmt::format(
        "node {} was started with --nnodes {} --nproc-per-node {} but node 0 with --nnodes {} --nproc-per-node {}; "
        "every node needs the same values",
        rank, nnodes, nproc, o.nnodes, o.nproc_per_node);
  else if (rank < 1 || rank >= o.nnodes)
    *refusal = fmt::format("a node joined with --node-rank {}, outside 1..{}", rank, o.nnodes - 1);
  else if (nodes[rank].is_open())
    *refusal = fmt::format("two nodes were started with --node-rank {} (from {} and {})", rank, nodes[rank].peer(),
                           from);
  else
    return rank;
  return -1;
}

}  // namespace

Channel::Channel(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}

Channel::Channel(Channel&& other) noexcept { *this = std::move(other); }

Channel& Channel::operator=(Channel&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = std::exchange(other.fd_, -1);
    peer_ = std::move(other.peer_);
    pending_ = std::move(other.pending_);
    queued_ = std::move(other.queued_);
  }
  return *this;
}

void Channel::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool Channel::send(const std::string& line) {
  TP_CHECK(line.find('\n') == std::string::npos, "a rendezvous message holds a newline: '{}'", line);
  if (fd_ < 0) return false;
  std::string data = line + "\n";
  size_t sent = 0;
  while (sent < data.size()) {
    ssize_t n = ::send(fd_, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      close();
      return false;
    }
    sent += static_cast<size_t>(n);
  }
  return true;
}

bool Channel::receive(std::vector<std::string>& lines) {
  if (fd_ < 0) return false;
  char buffer[4096];
  ssize_t n = ::recv(fd_, buffer, sizeof(buffer), MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
  if (n <= 0) {
    close();
    return false;
  }
  pending_.append(buffer, static_cast<size_t>(n));
  for (size_t eol; (eol = pending_.find('\n')) != std::string::npos; pending_.erase(0, eol + 1))
    lines.push_back(pending_.substr(0, eol));
  return true;
}

std::optional<std::string> Channel::next_line(double timeout_s) {
  Clock::time_point start = Clock::now();
  while (queued_.empty() && is_open()) {
    int wait_ms = static_cast<int>((timeout_s - seconds_since(start)) * 1000);
    if (wait_ms <= 0) return std::nullopt;
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, std::min(wait_ms, 100)) > 0) receive(queued_);
  }
  if (queued_.empty()) return std::nullopt;
  std::string line = queued_.front();
  queued_.erase(queued_.begin());
  return line;
}

std::pair<std::string, std::string> split_message(const std::string& line) {
  size_t space = line.find(' ');
  if (space == std::string::npos) return {line, ""};
  return {line.substr(0, space), line.substr(space + 1)};
}

int listen_tcp(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TP_CHECK(fd >= 0, "tprun: cannot create a TCP socket: {}", errno_text());
  int on = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 64) != 0) {
    std::string why = errno_text();
    ::close(fd);
    fail("tprun: node 0 cannot listen on port {}: {}{}", port, why,
         errno == EADDRINUSE ? " (another job or program holds it; pick another --master-port on every node)" : "");
  }
  return fd;
}

int bound_port(int listen_fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  getsockname(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return ntohs(addr.sin_port);
}

Channel connect_tcp(const std::string& host, int port, double timeout_s, std::string* why, const Tick& tick) {
  Clock::time_point start = Clock::now();
  std::string& last = *why;
  do {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
    if (rc != 0) {
      last = gai_strerror(rc);
    } else {
      for (addrinfo* a = found; a; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        if (connect_within(fd, a->ai_addr, a->ai_addrlen, 2000, &last)) {
          freeaddrinfo(found);
          keep_alive(fd);
          return Channel(fd, fmt::format("{}:{}", host, port));
        }
        ::close(fd);
      }
      freeaddrinfo(found);
    }
    if (tick) tick();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  } while (seconds_since(start) < timeout_s);
  return Channel();
}

int listen_unix(const std::string& path) {
  sockaddr_un addr = unix_address(path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TP_CHECK(fd >= 0, "tprun: cannot create a Unix socket: {}", errno_text());
  unlink(path.c_str());
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 16) != 0) {
    std::string why = errno_text();
    ::close(fd);
    fail("tprun: cannot listen on {}: {}", path, why);
  }
  return fd;
}

Channel connect_unix(const std::string& path) {
  sockaddr_un addr = unix_address(path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TP_CHECK(fd >= 0, "tprun: cannot create a Unix socket: {}", errno_text());
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::string why = errno_text();
    ::close(fd);
    fail("tprun: cannot reach node 0's tprun at {}: {}", path, why);
  }
  return Channel(fd, "local");
}

Channel accept_channel(int listen_fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  int fd = accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC);
  if (fd < 0) return Channel();
  if (addr.ss_family != AF_UNIX) keep_alive(fd);
  return Channel(fd, peer_name(addr));
}

std::vector<Channel> gather_nodes(int listen_fd, const LaunchOptions& o, const Tick& tick) {
  std::vector<Channel> nodes(o.nnodes);
  std::vector<Channel> pending;  // connected, not joined yet
  Clock::time_point start = Clock::now();
  auto joined = [&] {
    int n = 1;  // node 0
    for (size_t r = 1; r < nodes.size(); ++r) n += nodes[r].is_open();
    return n;
  };
  while (joined() < o.nnodes) {
    if (tick) tick();
    if (seconds_since(start) >= o.join_timeout_s)
      fail_all(nodes, fmt::format("node 0: {} of {} nodes joined at {}:{} within {:g} s; missing node ranks: {}. "
                                  "Start `tprun --nnodes {} --node-rank R --master-addr {} --master-port {} ...` on "
                                  "each of them, or raise --join-timeout",
                                  joined(), o.nnodes, o.master_addr, o.master_port, o.join_timeout_s,
                                  missing_ranks(nodes), o.nnodes, o.master_addr, o.master_port));
    std::vector<pollfd> fds{{listen_fd, POLLIN, 0}};
    for (Channel& c : pending) fds.push_back({c.fd(), POLLIN, 0});
    for (Channel& c : nodes)
      if (c.is_open()) fds.push_back({c.fd(), POLLIN, 0});
    if (poll(fds.data(), fds.size(), 100) <= 0) continue;
    if (fds[0].revents & POLLIN)
      if (Channel c = accept_channel(listen_fd); c.is_open()) pending.push_back(std::move(c));
    // A joined node that goes away before the start is missing again.
    std::vector<std::string> ignored;
    for (size_t r = 1; r < nodes.size(); ++r)
      if (nodes[r].is_open()) nodes[r].receive(ignored);
    for (Channel& c : pending) {
      std::vector<std::string> lines;
      if (!c.receive(lines) || lines.empty()) continue;
      std::string refusal;
      int rank = check_join(lines.front(), c.peer(), o, nodes, &refusal);
      if (rank < 0 && refusal.empty()) {
        c.close();
        continue;
      }
      if (rank < 0) {
        c.send("error " + refusal);
        fail_all(nodes, refusal);
      }
      c.send("ok");
      nodes[rank] = std::move(c);
    }
    std::erase_if(pending, [](const Channel& c) { return !c.is_open(); });
  }
  return nodes;
}

Channel join_job(const LaunchOptions& o, const Tick& tick) {
  Clock::time_point start = Clock::now();
  std::string why;
  Channel c = connect_tcp(o.master_addr, o.master_port, o.join_timeout_s, &why, tick);
  if (!c.is_open())
    fail("node {}: node 0's tprun: nobody answered at {}:{} within {:g} s ({}); start it with the same "
         "--master-addr and --master-port, or raise --join-timeout",
         o.node_rank, o.master_addr, o.master_port, o.join_timeout_s, why);
  c.send(join_line(o));
  std::optional<std::string> answer = c.next_line(std::max(1.0, o.join_timeout_s - seconds_since(start)));
  if (answer && *answer == "ok") return c;
  if (answer) {
    auto [verb, rest] = split_message(*answer);
    if (verb == "error") fail("{}", rest);
  }
  fail("node {}: {} is not a tprun node 0 of this job (it {} to the join)", o.node_rank, c.peer(),
       answer ? "answered '" + *answer + "'" : c.is_open() ? "did not answer" : "hung up");
}

}  // namespace tp::launcher
