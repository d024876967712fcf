#include "tp/serving/client_connection.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>

namespace tp::serving {

namespace {

// The numeric host and the port of a socket address; false for a non-IP one.
bool host_and_port(const sockaddr_storage& a, socklen_t len, std::string& host, int& port) {
  char h[NI_MAXHOST], p[NI_MAXSERV];
  if (a.ss_family != AF_INET && a.ss_family != AF_INET6) return false;
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, h, sizeof h, p, sizeof p,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  host = h;
  port = std::atoi(p);
  return true;
}

bool matches(int fd, const std::string& remote_addr, int remote_port, int local_port) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  std::string host;
  int port = -1;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 || !host_and_port(a, len, host, port) ||
      port != remote_port || host != remote_addr)
    return false;
  len = sizeof a;
  return getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0 && host_and_port(a, len, host, port) &&
         port == local_port;
}

}  // namespace

ClientConnection::ClientConnection(const std::string& remote_addr, int remote_port, int local_port) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    char* end = nullptr;
    const long fd = std::strtol(e.path().filename().c_str(), &end, 10);
    if (end != nullptr && *end == '\0' && matches(static_cast<int>(fd), remote_addr, remote_port, local_port)) {
      fd_ = static_cast<int>(fd);
      return;
    }
  }
}

bool ClientConnection::connected() const {
  if (fd_ < 0) return true;
  char c;
  // A peek that reads end-of-stream (0) or a reset is a client that has gone;
  // no data yet (EAGAIN), or a pipelined next request, is one still waiting.
  const ssize_t n = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0) return true;
  if (n == 0) return false;
  return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}

}  // namespace tp::serving
