#pragma once
// Whether the client of an HTTP request is still there. A handler that waits
// without writing (a non-streaming completion) can only learn that its client
// hung up from the connection's socket, and the HTTP library (cpp-httplib 0.11)
// gives a handler the connection's addresses but not its socket: this finds the
// socket by them.
#include <string>

namespace tp::serving {

class ClientConnection {
 public:
  // The connection from remote_addr:remote_port (numeric, as getnameinfo writes
  // it) to local_port. Not found (another transport): connected() stays true.
  ClientConnection(const std::string& remote_addr, int remote_port, int local_port);
  // False once the client has closed or reset its end. A client that shuts down
  // only its sending side reads as gone too (no HTTP client waits that way).
  bool connected() const;
  bool found() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace tp::serving
