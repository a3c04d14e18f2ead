// A TCP proxy on 127.0.0.1 between an S3 client and the real gateway that does to each new
// connection what its plan says: forward it, drop it, answer 500 or 503 SlowDown, stall,
// cut the answer short, change the range asked for, or forward the request but lose the answer (the server acted, the
// client never hears). A client that opens one connection per request (S3Options::
// max_connections = 0) meets one planned fault per request.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace s3_test {

class FaultProxy {
 public:
  // kShiftRange / kWidenRange forward a request with its Range header changed (it is not
  // signed), as a server that answers another range, or more bytes, than asked would.
  // kFlipBody forwards a request with one byte of its body changed (the first byte after
  // the head), as a network that damages data would.
  // Hostile answers (for up to 60 s, then the connection is closed): kEndlessBody, 200 and
  // bytes without end (no Content-Length); kEndlessError, the same with status 500;
  // kOversizedBody, 200 announcing 1 TiB and sending it; kTrickleBody, 200 and 4 KiB every
  // 250 ms without end (16 KiB/s: fast enough for curl's 1 KiB/s stall limit). kShortLength / kLongLength forward
  // the request and pass on the answer with its Content-Length 7 less (the body cut to it)
  // or 7 more (the connection then closed): a server wrong about the length.
  enum class Action {
    kForward, kDrop, k500, k503, kStall, kTruncate, kLoseResponse, kShiftRange, kWidenRange, kFlipBody,
    kEndlessBody, kEndlessError, kOversizedBody, kShortLength, kLongLength, kTrickleBody,
    // kCallThenDrop calls `call` (below) as the request arrives, then drops it;
    // kForwardThenCall forwards it and calls `call` once the server's answer begins, which
    // the client then never gets. (The SIGKILL test kills the client there.)
    kCallThenDrop, kForwardThenCall
  };
  // `upstream_port` on 127.0.0.1; connection i gets plan[i], those after the plan `after`;
  // `call(i)` for the two actions above.
  FaultProxy(int upstream_port, std::vector<Action> plan, Action after = Action::kForward,
             std::function<void(int)> call = {});
  ~FaultProxy();
  FaultProxy(const FaultProxy&) = delete;
  FaultProxy& operator=(const FaultProxy&) = delete;
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int connections() const { return accepted_.load(); }

 private:
  void AcceptLoop();
  void Handle(int client, Action action, int index);

  int upstream_port_;
  std::vector<Action> plan_;
  Action after_;
  std::function<void(int)> call_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<std::thread> handlers_;
};

}  // namespace s3_test
