#include "actors/node_link.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>

namespace troupe::link {
namespace {

constexpr char kMagic[8] = {'T', 'R', 'P', 'N', 'O', 'D', 'E', '1'};
constexpr size_t kNonce = 32, kMac = 32;

std::string sys_error(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// Keepalive: a peer that vanished without a FIN (power loss, cable) is noticed within
// about 20 s even by a reader with no deadline; no delay for small frames.
void tune(int fd) {
  int one = 1, idle = 10, intvl = 5, cnt = 2;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  // A peer that stops reading cannot block a writer for ever.
  timeval tv{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

Result<addrinfo*> resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string p = std::to_string(port);
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), p.c_str(), &hints, &res); rc != 0)
    return make_error("cannot resolve " + host + ": " + gai_strerror(rc));
  return res;
}

void mac(const std::string& key, const char* role, const uint8_t* nn, const uint8_t* nh, uint8_t out[kMac]) {
  uint8_t msg[4 + 2 * kNonce];
  std::memcpy(msg, role, 4);
  std::memcpy(msg + 4, nn, kNonce);
  std::memcpy(msg + 4 + kNonce, nh, kNonce);
  unsigned len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), msg, sizeof msg, out, &len);
}

}  // namespace

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

Socket::~Socket() {
  if (fd_ >= 0) ::close(fd_);
}

std::string Socket::peer() const {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (fd_ < 0 || getpeername(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "?";
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&a), len, host, sizeof host, serv, sizeof serv,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "?";
  return std::string(host) + ":" + serv;
}

Status Socket::write_all(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd_, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return make_error("send timed out (the peer stopped reading)");
      return make_error(sys_error("send"));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return {};
}

Status Socket::read_exact(void* data, size_t n, int timeout_ms) {
  auto* p = static_cast<uint8_t*>(data);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms);
  while (n > 0) {
    int wait = -1;
    if (timeout_ms >= 0) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0) return make_error("timed out");
      wait = static_cast<int>(left);
    }
    pollfd pf{fd_, POLLIN, 0};
    const int pr = ::poll(&pf, 1, wait);
    if (pr < 0) {
      if (errno == EINTR) continue;
      return make_error(sys_error("poll"));
    }
    if (pr == 0) return make_error("timed out");
    const ssize_t r = ::recv(fd_, p, n, 0);
    if (r == 0) return make_error("connection closed by the peer");
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return make_error(sys_error("recv"));
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return {};
}

void Socket::set_send_timeout(int ms) {
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  if (fd_ >= 0) setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

void Socket::shutdown() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

Result<Socket> connect_tcp(const std::string& host, int port, int timeout_ms) {
  auto res = resolve(host, port, false);
  if (!res) return res.error();
  std::string last = "no address";
  for (addrinfo* a = *res; a; a = a->ai_next) {
    // connect without blocking, wait for it with the deadline, then back to blocking
    Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (!s.valid()) {
      last = sys_error("socket");
      continue;
    }
    if (::connect(s.fd(), a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      last = sys_error("connect");
      continue;
    }
    pollfd pf{s.fd(), POLLOUT, 0};
    const int pr = ::poll(&pf, 1, timeout_ms);
    if (pr <= 0) {
      last = pr == 0 ? "connect timed out" : sys_error("poll");
      continue;
    }
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      last = std::strerror(err);
      continue;
    }
    fcntl(s.fd(), F_SETFL, fcntl(s.fd(), F_GETFL) & ~O_NONBLOCK);
    tune(s.fd());
    freeaddrinfo(*res);
    return s;
  }
  freeaddrinfo(*res);
  return make_error("cannot connect to " + host + ":" + std::to_string(port) + ": " + last);
}

Listener::~Listener() {
  if (fd_ >= 0) ::close(fd_);
}

Result<int> Listener::listen(const std::string& host, int port) {
  auto res = resolve(host, port, true);
  if (!res) return res.error();
  std::string last = "no address";
  for (addrinfo* a = *res; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last = sys_error("socket");
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 8) != 0) {
      last = sys_error("bind");
      ::close(fd);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
    const int p = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                              : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    freeaddrinfo(*res);
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
    return p;
  }
  freeaddrinfo(*res);
  return make_error("cannot listen on " + host + ":" + std::to_string(port) + ": " + last);
}

void Listener::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Result<Socket> Listener::accept(int timeout_ms) {
  if (fd_ < 0) return make_error("not listening");
  pollfd pf{fd_, POLLIN, 0};
  const int pr = ::poll(&pf, 1, timeout_ms);
  if (pr < 0) return make_error(sys_error("poll"));
  if (pr == 0) return make_error("timed out");
  const int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) return make_error(sys_error("accept"));
  tune(fd);
  return Socket(fd);
}

Status write_frame(Socket& s, Frame type, const Bytes& payload) {
  if (payload.size() > kMaxFrameBytes)
    return make_error("frame of " + std::to_string(payload.size()) + " bytes exceeds the link's limit");
  uint8_t head[8];
  const uint32_t t = static_cast<uint32_t>(type), n = static_cast<uint32_t>(payload.size());
  for (int i = 0; i < 4; ++i) {
    head[i] = static_cast<uint8_t>(t >> (8 * i));
    head[4 + i] = static_cast<uint8_t>(n >> (8 * i));
  }
  if (auto ok = s.write_all(head, sizeof head); !ok) return ok;
  return payload.empty() ? Status{} : s.write_all(payload.data(), payload.size());
}

Result<std::pair<Frame, Bytes>> read_frame(Socket& s, int timeout_ms) {
  uint8_t head[8];
  if (auto ok = s.read_exact(head, sizeof head, timeout_ms); !ok) return ok.error();
  uint32_t t = 0, n = 0;
  for (int i = 0; i < 4; ++i) {
    t |= static_cast<uint32_t>(head[i]) << (8 * i);
    n |= static_cast<uint32_t>(head[4 + i]) << (8 * i);
  }
  if (t < static_cast<uint32_t>(Frame::Hello) || t > static_cast<uint32_t>(Frame::ExpertResult))
    return make_error("unknown frame type " + std::to_string(t));
  if (n > kMaxFrameBytes) return make_error("frame of " + std::to_string(n) + " bytes exceeds the link's limit");
  Bytes payload(n);
  // the body follows its header at once: a peer that stalls mid-frame is cut off
  if (n > 0)
    if (auto ok = s.read_exact(payload.data(), n, 60000); !ok) return make_error("frame body: " + ok.error().message);
  return std::make_pair(static_cast<Frame>(t), std::move(payload));
}

Result<std::string> read_key_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error("cannot read the node key file " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string key = ss.str();
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r' || key.back() == ' ' || key.back() == '\t'))
    key.pop_back();
  if (key.size() < 16) return make_error("the node key in " + path + " is shorter than 16 bytes");
  if (key.size() > 4096) return make_error("the node key in " + path + " is longer than 4096 bytes");
  return key;
}

Status authenticate_as_node(Socket& s, const std::string& key, int timeout_ms) {
  uint8_t hello[sizeof kMagic + kNonce];
  std::memcpy(hello, kMagic, sizeof kMagic);
  uint8_t* nn = hello + sizeof kMagic;
  if (RAND_bytes(nn, kNonce) != 1) return make_error("no random bytes for the handshake");
  if (auto ok = s.write_all(hello, sizeof hello); !ok) return ok;
  uint8_t answer[sizeof kMagic + kNonce + kMac];
  if (auto ok = s.read_exact(answer, sizeof answer, timeout_ms); !ok)
    return make_error("handshake: " + ok.error().message);
  if (std::memcmp(answer, kMagic, sizeof kMagic) != 0) return make_error("handshake: not a troupe head (wrong magic)");
  const uint8_t* nh = answer + sizeof kMagic;
  uint8_t want[kMac];
  mac(key, "head", nn, nh, want);
  if (CRYPTO_memcmp(want, nh + kNonce, kMac) != 0) return make_error("handshake: wrong key");
  uint8_t proof[kMac];
  mac(key, "node", nn, nh, proof);
  return s.write_all(proof, sizeof proof);
}

Status authenticate_as_head(Socket& s, const std::string& key, int timeout_ms) {
  uint8_t hello[sizeof kMagic + kNonce];
  if (auto ok = s.read_exact(hello, sizeof hello, timeout_ms); !ok)
    return make_error("handshake: " + ok.error().message);
  if (std::memcmp(hello, kMagic, sizeof kMagic) != 0) return make_error("handshake: not a troupe node (wrong magic)");
  const uint8_t* nn = hello + sizeof kMagic;
  uint8_t answer[sizeof kMagic + kNonce + kMac];
  std::memcpy(answer, kMagic, sizeof kMagic);
  uint8_t* nh = answer + sizeof kMagic;
  if (RAND_bytes(nh, kNonce) != 1) return make_error("no random bytes for the handshake");
  mac(key, "head", nn, nh, nh + kNonce);
  if (auto ok = s.write_all(answer, sizeof answer); !ok) return ok;
  uint8_t proof[kMac], want[kMac];
  if (auto ok = s.read_exact(proof, sizeof proof, timeout_ms); !ok)
    return make_error("handshake: the node did not accept the key (" + ok.error().message + ")");
  mac(key, "node", nn, nh, want);
  if (CRYPTO_memcmp(want, proof, kMac) != 0)
    return make_error("handshake: the node's proof is wrong (a different key)");
  return {};
}

}  // namespace troupe::link
