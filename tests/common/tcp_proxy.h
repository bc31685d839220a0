// A TCP proxy on 127.0.0.1 for network-fault tests: every connection made
// to it is joined to a new connection to the target, and bytes go both ways
// until the test says otherwise. It can lose what the target sends (read and
// dropped, so the target believes it was sent: an answer lost on the way
// back), cut every open connection (both ends closed: the client sees the
// connection reset), and refuse new connections (the target unreachable).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <thread>

namespace cortiq::testing {

class TcpProxy {
 public:
  explicit TcpProxy(int target_port) : target_port_(target_port) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        listen(listen_fd_, 16) != 0) {
      close(listen_fd_);
      listen_fd_ = -1;
      return;
    }
    socklen_t len = sizeof(a);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { Accept(); });
  }
  ~TcpProxy() {
    stop_ = true;
    if (acceptor_.joinable()) acceptor_.join();
    if (listen_fd_ >= 0) close(listen_fd_);
    std::list<Pipe> pipes;
    {
      std::lock_guard lock(mu_);
      pipes.swap(pipes_);
    }
    for (Pipe& p : pipes) {
      p.stop = true;
      if (p.thread.joinable()) p.thread.join();
      close(p.client);
      close(p.target);
    }
  }
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  bool ok() const { return port_ != 0; }
  std::string addr() const { return "127.0.0.1:" + std::to_string(port_); }

  // From now on (or no longer), what the target sends on any connection is
  // read and dropped.
  void LoseReplies(bool lose) { lose_ = lose; }
  // Bytes dropped so far.
  uint64_t lost_bytes() const { return lost_bytes_.load(); }
  // Closes both ends of every open connection.
  void CutAll() {
    std::lock_guard lock(mu_);
    for (Pipe& p : pipes_) {
      shutdown(p.client, SHUT_RDWR);
      shutdown(p.target, SHUT_RDWR);
    }
  }
  // New connections are closed at once, unjoined (or accepted again).
  void Refuse(bool refuse) { refuse_ = refuse; }
  // Connections accepted so far (refused ones included).
  int accepted() const { return accepted_.load(); }

 private:
  struct Pipe {
    int client = -1;
    int target = -1;
    std::atomic<bool> stop{false};
    std::thread thread;
  };

  void Accept() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      const int c = accept(listen_fd_, nullptr, nullptr);
      if (c < 0) continue;
      ++accepted_;
      if (refuse_) {
        close(c);
        continue;
      }
      const int t = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<uint16_t>(target_port_));
      if (connect(t, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        close(c);
        close(t);
        continue;
      }
      std::lock_guard lock(mu_);
      Pipe& pipe = pipes_.emplace_back();
      pipe.client = c;
      pipe.target = t;
      pipe.thread = std::thread([this, &pipe] { Forward(pipe); });
    }
  }

  // Copies bytes both ways until either end closes (or the proxy stops).
  void Forward(Pipe& p) {
    char buf[1 << 16];
    while (!p.stop) {
      pollfd fds[2] = {{p.client, POLLIN, 0}, {p.target, POLLIN, 0}};
      if (poll(fds, 2, 20) <= 0) continue;
      for (int i = 0; i < 2; ++i) {
        if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        const ssize_t n = read(fds[i].fd, buf, sizeof(buf));
        if (n <= 0) {
          shutdown(p.client, SHUT_RDWR);
          shutdown(p.target, SHUT_RDWR);
          return;
        }
        if (i == 1 && lose_) {
          lost_bytes_ += static_cast<uint64_t>(n);
          continue;
        }
        const int to = i == 0 ? p.target : p.client;
        for (ssize_t off = 0; off < n;) {
          const ssize_t w = send(to, buf + off, static_cast<size_t>(n - off), MSG_NOSIGNAL);
          if (w < 0 && errno == EINTR) continue;
          if (w <= 0) return;
          off += w;
        }
      }
    }
  }

  const int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false}, lose_{false}, refuse_{false};
  std::atomic<uint64_t> lost_bytes_{0};
  std::atomic<int> accepted_{0};
  std::mutex mu_;
  std::list<Pipe> pipes_;
  std::thread acceptor_;
};

}  // namespace cortiq::testing
