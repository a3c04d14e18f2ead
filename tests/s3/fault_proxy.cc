#include "fault_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <stdexcept>

namespace s3_test {
namespace {

constexpr int kPollMs = 50;

// Waits until `fd` is readable or `ms` pass; false on timeout or when stopping.
bool Readable(int fd, int ms, const std::atomic<bool>& stop) {
  for (int waited = 0; waited < ms && !stop; waited += kPollMs) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, kPollMs) > 0) return true;
  }
  return false;
}

bool SendAll(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

// Reads the request head (through the blank line) and whatever came with it.
std::string ReadHead(int fd, const std::atomic<bool>& stop) {
  std::string buf;
  char tmp[4096];
  while (buf.find("\r\n\r\n") == std::string::npos && Readable(fd, 5000, stop)) {
    const ssize_t r = ::recv(fd, tmp, sizeof tmp, 0);
    if (r <= 0) break;
    buf.append(tmp, static_cast<std::size_t>(r));
  }
  return buf;
}

// Reads and drops the rest of the request's body (its Content-Length, less what ReadHead took
// past the head), so that an error answered to a PUT reaches a client still sending it, as a
// server's would, instead of a reset that races the answer.
void DrainBody(int fd, const std::string& head, const std::atomic<bool>& stop) {
  const std::size_t end = head.find("\r\n\r\n");
  if (end == std::string::npos) return;
  std::string lower = head.substr(0, end);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  const std::size_t at = lower.find("\r\ncontent-length:");
  if (at == std::string::npos) return;
  const unsigned long long length = std::strtoull(lower.c_str() + at + 17, nullptr, 10);
  unsigned long long left = length > head.size() - end - 4 ? length - (head.size() - end - 4) : 0;
  char tmp[65536];
  while (left > 0 && Readable(fd, 5000, stop)) {
    const ssize_t r = ::recv(fd, tmp, std::min<unsigned long long>(sizeof tmp, left), 0);
    if (r <= 0) return;
    left -= static_cast<unsigned long long>(r);
  }
}

int ConnectUpstream(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  return fd;
}

// "Range: bytes=A-B" becomes bytes=(A+1)-(B+1) (shift) or bytes=A-(B+100) (widen).
std::string RewriteRange(std::string head, bool widen) {
  const std::string tag = "Range: bytes=";
  const auto at = head.find(tag);
  if (at == std::string::npos) return head;
  const auto begin = at + tag.size();
  const auto dash = head.find('-', begin);
  const auto eol = head.find("\r\n", dash);
  const unsigned long long a = std::stoull(head.substr(begin, dash - begin));
  const unsigned long long b = std::stoull(head.substr(dash + 1, eol - dash - 1));
  const std::string range = widen ? std::to_string(a) + "-" + std::to_string(b + 100)
                                  : std::to_string(a + 1) + "-" + std::to_string(b + 1);
  return head.replace(begin, eol - begin, range);
}

void Reply(int fd, int status, const char* reason, const char* code) {
  const std::string body = std::string("<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>") + code +
                           "</Code><Message>injected by the test proxy</Message></Error>";
  const std::string head = "HTTP/1.1 " + std::to_string(status) + " " + reason +
                           "\r\nContent-Type: application/xml\r\nContent-Length: " + std::to_string(body.size()) +
                           "\r\nConnection: close\r\n\r\n";
  SendAll(fd, head.data(), head.size());
  SendAll(fd, body.data(), body.size());
}

// Sends `head`, then bytes until the client stops reading or closes, `stop`, or 60 s.
void Endless(int fd, const std::string& head, const std::atomic<bool>& stop) {
  if (!SendAll(fd, head.data(), head.size())) return;
  const std::string chunk(64 << 10, 'x');
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!stop && std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, kPollMs) <= 0) continue;  // the client is not reading now
    if (p.revents & (POLLERR | POLLHUP)) return;
    const ssize_t w = ::send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return;
  }
}

// Sends `head`, then 4 KiB every 250 ms until `stop`, the client leaves, or 60 s.
void Trickle(int fd, const std::string& head, const std::atomic<bool>& stop) {
  if (!SendAll(fd, head.data(), head.size())) return;
  const std::string chunk(4 << 10, 'x');
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!stop && std::chrono::steady_clock::now() < end) {
    if (!SendAll(fd, chunk.data(), chunk.size())) return;
    for (int i = 0; i < 250 / kPollMs && !stop; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(kPollMs));
  }
}

// Relays the upstream's answer with its Content-Length changed by `delta` (-7 or +7): the
// body passed on is cut to the new length, or the connection closed after the real body.
void RelayWrongLength(int client, int upstream, long long delta, const std::atomic<bool>& stop) {
  std::string buf;
  char tmp[65536];
  std::size_t head_end = std::string::npos;
  while (head_end == std::string::npos && Readable(upstream, 5000, stop)) {
    const ssize_t r = ::recv(upstream, tmp, sizeof tmp, 0);
    if (r <= 0) return;
    buf.append(tmp, static_cast<std::size_t>(r));
    head_end = buf.find("\r\n\r\n");
  }
  if (head_end == std::string::npos) return;
  std::string head = buf.substr(0, head_end + 4);
  std::string body = buf.substr(head_end + 4);
  const std::string tag = "\r\ncontent-length: ";
  std::string lower = head;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const auto at = lower.find(tag);
  if (at == std::string::npos) return;  // no length to lie about: drop
  const auto begin = at + tag.size(), eol = head.find("\r\n", begin);
  const long long real = std::stoll(head.substr(begin, eol - begin));
  const long long told = std::max(0LL, real + delta);
  head.replace(begin, eol - begin, std::to_string(told));
  // Read the rest of the real body.
  while (static_cast<long long>(body.size()) < real && Readable(upstream, 5000, stop)) {
    const ssize_t r = ::recv(upstream, tmp, sizeof tmp, 0);
    if (r <= 0) break;
    body.append(tmp, static_cast<std::size_t>(r));
  }
  SendAll(client, head.data(), head.size());
  SendAll(client, body.data(), static_cast<std::size_t>(std::min<long long>(told, static_cast<long long>(body.size()))));
}

}  // namespace

FaultProxy::FaultProxy(int upstream_port, std::vector<Action> plan, Action after, std::function<void(int)> call)
    : upstream_port_(upstream_port), plan_(std::move(plan)), after_(after), call_(std::move(call)) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(listen_fd_, 64) != 0 || ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    throw std::runtime_error("fault proxy: cannot listen on 127.0.0.1");
  }
  port_ = ntohs(a.sin_port);
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

FaultProxy::~FaultProxy() {
  stop_ = true;
  acceptor_.join();
  ::close(listen_fd_);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& t : handlers_) t.join();
}

void FaultProxy::AcceptLoop() {
  while (!stop_) {
    if (!Readable(listen_fd_, kPollMs, stop_)) continue;
    const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    const int i = accepted_++;
    const Action action = static_cast<std::size_t>(i) < plan_.size() ? plan_[static_cast<std::size_t>(i)] : after_;
    std::lock_guard<std::mutex> lock(mu_);
    handlers_.emplace_back([this, client, action, i] { Handle(client, action, i); });
  }
}

void FaultProxy::Handle(int client, Action action, int index) {
  std::string head = ReadHead(client, stop_);
  if (action == Action::kShiftRange || action == Action::kWidenRange) {
    head = RewriteRange(std::move(head), action == Action::kWidenRange);
    action = Action::kForward;
  }
  int upstream = -1;
  switch (action) {
    case Action::kDrop:
      break;
    case Action::kCallThenDrop:
      if (call_) call_(index);
      break;
    case Action::k500:
      DrainBody(client, head, stop_);
      Reply(client, 500, "Internal Server Error", "InternalError");
      break;
    case Action::k503:
      DrainBody(client, head, stop_);
      Reply(client, 503, "Slow Down", "SlowDown");
      break;
    case Action::kEndlessBody:
      Endless(client, "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n", stop_);
      break;
    case Action::kEndlessError:
      Endless(client, "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/xml\r\nConnection: close\r\n\r\n"
                      "<?xml version=\"1.0\"?><Error><Code>InternalError</Code><Message>",
              stop_);
      break;
    case Action::kTrickleBody:
      Trickle(client, "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n", stop_);
      break;
    case Action::kOversizedBody:
      Endless(client, "HTTP/1.1 200 OK\r\nContent-Length: 1099511627776\r\nContent-Range: bytes 0-1099511627775/1099511627776\r\n\r\n", stop_);
      break;
    case Action::kShortLength:
    case Action::kLongLength:
      upstream = ConnectUpstream(upstream_port_);
      if (upstream >= 0 && SendAll(upstream, head.data(), head.size())) {
        RelayWrongLength(client, upstream, action == Action::kShortLength ? -7 : 7, stop_);
      }
      break;
    case Action::kStall: {  // say nothing until the client gives up (or 20 s)
      char tmp[4096];
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!stop_ && std::chrono::steady_clock::now() < end) {
        if (Readable(client, kPollMs, stop_) && ::recv(client, tmp, sizeof tmp, 0) <= 0) break;
      }
      break;
    }
    case Action::kShiftRange:
    case Action::kWidenRange:
    case Action::kFlipBody:
    case Action::kForward:
    case Action::kTruncate:
    case Action::kForwardThenCall:
    case Action::kLoseResponse: {
      upstream = ConnectUpstream(upstream_port_);
      // kFlipBody: the body's first byte, in what ReadHead took past the head or in the
      // first piece read after it.
      bool flip = action == Action::kFlipBody;
      if (flip && head.find("\r\n\r\n") + 4 < head.size()) {
        head[head.find("\r\n\r\n") + 4] ^= 0x01;
        flip = false;
      }
      if (upstream < 0 || !SendAll(upstream, head.data(), head.size())) break;
      // Relay both ways; kTruncate passes on only the first 600 bytes of the answer,
      // kLoseResponse none (and ends 300 ms after the answer began).
      std::size_t answered = 0;
      auto answer_began = std::chrono::steady_clock::time_point::max();
      char tmp[65536];
      while (!stop_) {
        pollfd p[2] = {{client, POLLIN, 0}, {upstream, POLLIN, 0}};
        if (::poll(p, 2, kPollMs) < 0) break;
        if (action == Action::kLoseResponse && std::chrono::steady_clock::now() - answer_began > std::chrono::milliseconds(300)) break;
        if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
          const ssize_t r = ::recv(client, tmp, sizeof tmp, 0);
          if (r > 0 && flip) {
            tmp[0] ^= 0x01;
            flip = false;
          }
          if (r <= 0 || !SendAll(upstream, tmp, static_cast<std::size_t>(r))) break;
        }
        if (p[1].revents & (POLLIN | POLLHUP | POLLERR)) {
          const ssize_t r = ::recv(upstream, tmp, sizeof tmp, 0);
          if (r <= 0) break;
          if (answer_began == std::chrono::steady_clock::time_point::max()) answer_began = std::chrono::steady_clock::now();
          if (action == Action::kForwardThenCall) {
            if (call_) call_(index);
            break;
          }
          if (action == Action::kLoseResponse) continue;
          std::size_t n = static_cast<std::size_t>(r);
          if (action == Action::kTruncate) n = std::min(n, 600 - std::min<std::size_t>(answered, 600));
          if (!SendAll(client, tmp, n)) break;
          answered += n;
          if (action == Action::kTruncate && answered >= 600) break;
        }
      }
      break;
    }
  }
  if (upstream >= 0) ::close(upstream);
  ::shutdown(client, SHUT_RDWR);
  ::close(client);
}

}  // namespace s3_test
