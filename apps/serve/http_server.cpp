#include "apps/serve/http_server.h"

#include <spdlog/spdlog.h>

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <deque>
#include <memory>
#include <optional>

namespace troupe::serve {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

std::string status_line(int status) {
  const auto reason = http::obsolete_reason(static_cast<http::status>(status));
  return "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason.data(), reason.size()) + "\r\n";
}

class Session;

class ExchangeImpl : public Exchange {
 public:
  ExchangeImpl(std::shared_ptr<Session> s, http::request<http::string_body> req, uint64_t id)
      : session_(std::move(s)), req_(std::move(req)), id_(id) {
    method_ = std::string(req_.method_string());
    target_ = std::string(req_.target());
  }
  const std::string& method() const override { return method_; }
  const std::string& target() const override { return target_; }
  const std::string& body() const override { return req_.body(); }
  std::string header(const std::string& name) const override {
    auto it = req_.find(name);
    return it == req_.end() ? std::string() : std::string(it->value());
  }
  void respond(int status, std::string content_type, std::string body,
               std::map<std::string, std::string> extra) override;
  void start_stream(std::string content_type) override;
  void send_chunk(std::string data) override;
  void end_stream() override;
  void on_disconnect(std::function<void()> fn) override;

  bool keep_alive() const { return req_.keep_alive(); }
  uint64_t id() const { return id_; }

 private:
  std::shared_ptr<Session> session_;
  http::request<http::string_body> req_;
  uint64_t id_;
  std::string method_, target_;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  // `open` counts the server's open connections: this one until its socket is closed.
  // `busy` counts responses begun and not yet written out (or abandoned by a close).
  Session(tcp::socket sock, const HttpLimits& lim, const Handler& h, std::shared_ptr<std::atomic<int>> open,
          std::shared_ptr<std::atomic<int>> busy)
      : stream_(std::move(sock)),
        timer_(stream_.get_executor()),
        lim_(lim),
        handler_(h),
        open_(std::move(open)),
        busy_(std::move(busy)) {
    open_->fetch_add(1);
  }
  ~Session() {
    set_busy(false);
    release();
  }
  void start() { read(); }

  // All of these run on the session's strand.
  void write(std::string data, bool ends_response, uint64_t exchange) {
    if (closed_ || exchange != exchange_id_) return;
    if (ends_response) {
      response_ended_ = true;
      on_gone_ = nullptr;  // (it may hold the request's actor, which holds this session)
    }
    outq_.push_back(std::move(data));
    if (!writing_) write_next();
  }
  void set_disconnect(std::function<void()> fn, uint64_t exchange) {
    if (exchange != exchange_id_) return;
    if (closed_) {
      if (fn) fn();
      return;
    }
    on_gone_ = std::move(fn);
  }
  void set_close_after(bool close) { close_after_ = close; }
  net::any_io_executor executor() { return stream_.get_executor(); }
  uint64_t exchange_id() const { return exchange_id_; }

 private:
  void read() {
    parser_.emplace();
    parser_->body_limit(lim_.max_body_bytes);
    parser_->header_limit(static_cast<std::uint32_t>(lim_.max_header_bytes));
    // Our own timer (not the stream's, which would close the socket) so a slow client gets a 408.
    timed_out_ = false;
    timer_.expires_after(std::chrono::seconds(lim_.read_timeout_seconds));
    timer_.async_wait([self = shared_from_this(), gen = ++read_gen_](beast::error_code ec) {
      if (ec || gen != self->read_gen_ || self->closed_) return;
      self->timed_out_ = true;
      beast::error_code e;
      self->stream_.socket().cancel(e);
    });
    http::async_read(stream_, buf_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void reply_error_and_close(int status, const std::string& message) {
    const std::string body =
        R"({"error":{"message":")" + message + R"(","type":"invalid_request_error","param":null,"code":null}})";
    ++exchange_id_;
    response_ended_ = true;
    close_after_ = true;
    linger_ = true;  // the client may still be sending the request we did not read
    outq_.push_back(status_line(status) + "Content-Type: application/json\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
    if (!writing_) write_next();
  }

  void on_read(beast::error_code ec) {
    ++read_gen_;
    timer_.cancel();
    if (timed_out_) return reply_error_and_close(408, "request timed out");
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset) return close();
    if (ec == http::error::body_limit) return reply_error_and_close(413, "request body is too large");
    if (ec == http::error::header_limit) return reply_error_and_close(431, "request headers are too large");
    if (ec) return reply_error_and_close(400, "malformed HTTP request");
    const uint64_t id = ++exchange_id_;
    response_ended_ = false;
    close_after_ = false;
    set_busy(true);
    auto ex = std::make_shared<ExchangeImpl>(shared_from_this(), parser_->release(), id);
    close_after_ = !ex->keep_alive();
    watch_disconnect(id);
    handler_(ex);
  }

  // The socket turning readable with nothing to read means the peer closed it. Bytes that
  // do arrive meanwhile (a pipelined request, a stray CRLF) are moved into the read buffer
  // for the next request, up to a cap, and the watch goes on.
  void watch_disconnect(uint64_t id) {
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(), id](beast::error_code ec) {
      if (ec || id != self->exchange_id_ || self->response_ended_ || self->closed_) return;
      beast::error_code e2;
      const size_t avail = self->stream_.socket().available(e2);
      if (e2 || avail == 0) return self->close();
      if (self->buf_.size() + avail > self->lim_.max_header_bytes + self->lim_.max_body_bytes) return;
      const size_t n = self->stream_.socket().read_some(self->buf_.prepare(avail), e2);
      if (e2) return self->close();
      self->buf_.commit(n);
      self->watch_disconnect(id);
    });
  }

  void write_next() {
    writing_ = true;
    net::async_write(stream_, net::buffer(outq_.front()), [self = shared_from_this()](beast::error_code ec, size_t) {
      self->outq_.pop_front();
      if (ec) return self->close();
      if (!self->outq_.empty()) return self->write_next();
      self->writing_ = false;
      if (self->response_ended_) {
        self->set_busy(false);
        if (self->close_after_) return self->linger_ ? self->linger_close() : self->close();
        self->read();
      }
    });
  }

  // Lingering close after an error reply to a request whose body was not read (413, 408,
  // 400): closing with unread bytes would make the kernel answer the client's next segment
  // with a reset, and a client still sending sees a broken pipe instead of our status. So
  // the sending side is shut (the client reads the reply and EOF) and what it still sends
  // is read and dropped, up to kLingerBytes or kLingerSeconds, then the socket is closed.
  static constexpr size_t kLingerBytes = size_t{64} << 20;
  static constexpr int kLingerSeconds = 5;
  void linger_close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return close();
    timer_.expires_after(std::chrono::seconds(kLingerSeconds));
    timer_.async_wait([self = shared_from_this()](beast::error_code e) {
      if (!e) self->close();
    });
    drain();
  }
  void drain() {
    if (!drain_buf_) drain_buf_ = std::make_unique<std::array<char, 16384>>();
    stream_.socket().async_read_some(net::buffer(*drain_buf_),
                                     [self = shared_from_this()](beast::error_code ec, size_t n) {
                                       if (self->closed_) return;
                                       self->drained_ += n;
                                       if (ec || self->drained_ > kLingerBytes) return self->close();
                                       self->drain();
                                     });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    timer_.cancel();
    if (!response_ended_ && on_gone_) {
      auto fn = std::move(on_gone_);
      fn();
    }
    on_gone_ = nullptr;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.socket().close(ec);
    set_busy(false);
    release();  // (the session may live on in an exchange; its descriptor does not)
  }

  void set_busy(bool b) {
    if (b == busy_held_ || !busy_) return;
    busy_held_ = b;
    busy_->fetch_add(b ? 1 : -1);
  }

  void release() {
    if (open_) open_->fetch_sub(1);
    open_.reset();
  }

  beast::tcp_stream stream_;
  net::steady_timer timer_;
  uint64_t read_gen_ = 0;
  bool timed_out_ = false;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  const HttpLimits& lim_;
  const Handler& handler_;
  std::deque<std::string> outq_;
  bool writing_ = false, closed_ = false, response_ended_ = true, close_after_ = false, linger_ = false;
  std::unique_ptr<std::array<char, 16384>> drain_buf_;  // (only while lingering)
  size_t drained_ = 0;
  uint64_t exchange_id_ = 0;
  std::function<void()> on_gone_;
  std::shared_ptr<std::atomic<int>> open_, busy_;
  bool busy_held_ = false;
};

void ExchangeImpl::respond(int status, std::string content_type, std::string body,
                           std::map<std::string, std::string> extra) {
  std::string head = status_line(status) + "Content-Type: " + content_type +
                     "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  for (const auto& [k, v] : extra) head += k + ": " + v + "\r\n";
  head += keep_alive() ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  net::post(session_->executor(),
            [s = session_, data = head + body, id = id_]() mutable { s->write(std::move(data), true, id); });
}

void ExchangeImpl::start_stream(std::string content_type) {
  std::string head = status_line(200) + "Content-Type: " + content_type +
                     "\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n";
  head += keep_alive() ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  net::post(session_->executor(),
            [s = session_, data = std::move(head), id = id_]() mutable { s->write(std::move(data), false, id); });
}

void ExchangeImpl::send_chunk(std::string data) {
  if (data.empty()) return;  // an empty chunk would end the stream
  char hex[32];
  std::snprintf(hex, sizeof hex, "%zx\r\n", data.size());
  std::string framed = hex + data + "\r\n";
  net::post(session_->executor(),
            [s = session_, data = std::move(framed), id = id_]() mutable { s->write(std::move(data), false, id); });
}

void ExchangeImpl::end_stream() {
  net::post(session_->executor(), [s = session_, id = id_]() { s->write("0\r\n\r\n", true, id); });
}

void ExchangeImpl::on_disconnect(std::function<void()> fn) {
  net::post(session_->executor(),
            [s = session_, fn = std::move(fn), id = id_]() mutable { s->set_disconnect(std::move(fn), id); });
}

}  // namespace

HttpServer::HttpServer(net::io_context& io, HttpLimits limits, Handler handler)
    : io_(io), limits_(limits), handler_(std::move(handler)), acceptor_(io), retry_(io) {}

unsigned short HttpServer::listen(const std::string& host, unsigned short port) {
  tcp::endpoint ep(net::ip::make_address(host), port);
  acceptor_.open(ep.protocol());
  acceptor_.set_option(net::socket_base::reuse_address(true));
  acceptor_.bind(ep);
  acceptor_.listen(net::socket_base::max_listen_connections);
  accept();
  return acceptor_.local_endpoint().port();
}

void HttpServer::stop_accepting() {
  beast::error_code ec;
  acceptor_.close(ec);
  retry_.cancel();
}

void HttpServer::accept() {
  acceptor_.async_accept(net::make_strand(io_), [this](beast::error_code ec, tcp::socket sock) {
    if (ec == net::error::operation_aborted || !acceptor_.is_open()) return;
    if (ec) {
      // Out of descriptors (EMFILE, ENFILE) or memory: the pending connection stays queued,
      // so accepting again at once would fail again at once, a loop that spins a core.
      if (accept_failures_++ % 1000 == 0)
        spdlog::warn("accepting a connection failed: {} ({} time(s)); trying again every 100 ms", ec.message(),
                     accept_failures_);
      retry_.expires_after(std::chrono::milliseconds(100));
      retry_.async_wait([this](beast::error_code e) {
        if (!e && acceptor_.is_open()) accept();
      });
      return;
    }
    if (open_->load() >= limits_.max_connections)
      refuse(std::move(sock));
    else
      std::make_shared<Session>(std::move(sock), limits_, handler_, open_, busy_)->start();
    accept();
  });
}

// A connection over --max-connections: a 503 written without waiting (a few hundred bytes
// into a new socket's empty send buffer), then closed, so it holds no descriptor.
void HttpServer::refuse(tcp::socket sock) {
  if (refused_++ % 1000 == 0)
    spdlog::warn("{} connections open (--max-connections): refusing new ones with 503 ({} so far)",
                 limits_.max_connections, refused_);
  const std::string body = R"({"error":{"message":"too many open connections (limit )" +
                           std::to_string(limits_.max_connections) +
                           R"(); try again later","type":"server_error","param":null,"code":null}})";
  const std::string resp = status_line(503) + "Content-Type: application/json\r\nRetry-After: 1\r\nContent-Length: " +
                           std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  beast::error_code ec;
  sock.non_blocking(true, ec);
  sock.write_some(net::buffer(resp), ec);
  sock.shutdown(tcp::socket::shutdown_both, ec);
  sock.close(ec);
}

int fit_connections(int wanted, int reserve, long* limit_out) {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    if (limit_out) *limit_out = -1;
    return wanted;  // (unknown: nothing to fit against)
  }
  const rlim_t need = static_cast<rlim_t>(wanted) + static_cast<rlim_t>(reserve);
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
    rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max == RLIM_INFINITY ? need : std::min(need, rl.rlim_max);
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
  }
  if (limit_out) *limit_out = rl.rlim_cur == RLIM_INFINITY ? -1 : static_cast<long>(rl.rlim_cur);
  if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= need) return wanted;
  return static_cast<int>(static_cast<long>(rl.rlim_cur) - reserve);
}

}  // namespace troupe::serve
