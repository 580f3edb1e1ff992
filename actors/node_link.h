// Node links: the TCP connection between a head (`troupe serve`, which owns the scheduler)
// and a stage node (`troupe node`, which runs some of the pipeline's layers). Plain POSIX
// sockets carrying length-prefixed frames; each frame's payload is one Cap'n Proto message
// of schema/troupe.capnp (actors/codec.h), which the receiver decodes only after both sides
// have proved they hold the same key:
//
//   node -> head   "TRPNODE1" nonce_n (32 random bytes)
//   head -> node   "TRPNODE1" nonce_h  HMAC-SHA256(key, "head" nonce_n nonce_h)
//   node -> head   HMAC-SHA256(key, "node" nonce_n nonce_h)
//
// A wrong key, wrong magic or silence (handshake timeout) closes the connection before a
// single frame is read; frames larger than the codec's limit close it too. The key is a
// file's contents (at least 16 bytes), the same on both machines. The link authenticates
// peers; it does not encrypt (run it on a trusted network or through a tunnel).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/result.h"

namespace troupe::link {

using Bytes = std::vector<uint8_t>;

// The largest payload a frame may carry: the codec refuses larger messages anyway.
constexpr size_t kMaxFrameBytes = 64u << 20;
constexpr int kHandshakeTimeoutMs = 5000;

enum class Frame : uint32_t {
  Hello = 1,           // head -> node: NodeHello
  HelloReply = 2,      // node -> head: NodeHelloReply
  Step = 3,            // head -> node: StageStep
  StepResult = 4,      // node -> head: StepDone or StepFailed (last stage)
  Activations = 5,     // node -> head: StageStep with the stage's activations (middle stage)
  ExpertDispatch = 6,  // head -> expert node: ExpertDispatch
  ExpertResult = 7,    // expert node -> head: ExpertResult
};

// One connected TCP socket. One thread may read while another writes; shutdown() from any
// thread wakes a blocked reader; the descriptor closes with the object.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket();
  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  std::string peer() const;  // "address:port"
  Status write_all(const void* data, size_t n);
  // timeout_ms < 0: wait as long as the connection lives (TCP keepalive notices a dead peer).
  Status read_exact(void* data, size_t n, int timeout_ms);
  void shutdown();
  // How long one send may block on a peer that stopped reading (30 s after connect/accept).
  void set_send_timeout(int ms);

 private:
  int fd_ = -1;
};

Result<Socket> connect_tcp(const std::string& host, int port, int timeout_ms);

class Listener {
 public:
  Listener() = default;
  Listener(Listener&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Listener(const Listener&) = delete;
  ~Listener();
  // Binds and listens; returns the bound port (port 0: any free one).
  Result<int> listen(const std::string& host, int port);
  // The next connection, or an error after timeout_ms (then try again).
  Result<Socket> accept(int timeout_ms);
  void close();  // stop listening (new connections are refused)

 private:
  int fd_ = -1;
};

Status write_frame(Socket& s, Frame type, const Bytes& payload);
Result<std::pair<Frame, Bytes>> read_frame(Socket& s, int timeout_ms);

// The shared key: a file's contents without trailing whitespace, at least 16 bytes.
Result<std::string> read_key_file(const std::string& path);

// Mutual authentication (above). Both return an error naming what failed.
Status authenticate_as_head(Socket& s, const std::string& key, int timeout_ms = kHandshakeTimeoutMs);
Status authenticate_as_node(Socket& s, const std::string& key, int timeout_ms = kHandshakeTimeoutMs);

}  // namespace troupe::link
