// A small HTTP/1.1 server over Boost.Beast/Asio: keep-alive, limits on header and body
// size, a read timeout, and responses that are either whole or streamed (chunked transfer,
// for server-sent events). Routing lives elsewhere: every parsed request goes to one
// handler as an Exchange, which any thread may answer (calls are posted to the
// connection's strand). A client that goes away while its request is being answered is
// noticed (the socket turns readable with no data, or a write fails) and the exchange's
// disconnect callback runs once.
#pragma once
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange under C++20

#include <boost/asio.hpp>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>

namespace troupe::serve {

struct HttpLimits {
  size_t max_body_bytes = 8u << 20;
  size_t max_header_bytes = 16u << 10;
  int read_timeout_seconds = 30;   // a request's headers and body must arrive within this
  int idle_timeout_seconds = 120;  // keep-alive connections idle longer are closed
  int max_connections = 1024;      // open connections; one more gets a 503 and is closed at once
};

class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual const std::string& method() const = 0;
  virtual const std::string& target() const = 0;  // path and query
  virtual const std::string& body() const = 0;
  // Header value ("" when absent); names are case-insensitive.
  virtual std::string header(const std::string& name) const = 0;
  // A whole response. Extra headers (e.g. Retry-After) may be given.
  virtual void respond(int status, std::string content_type, std::string body,
                       std::map<std::string, std::string> extra = {}) = 0;
  // A streamed response: the head now, then chunks, then the end.
  virtual void start_stream(std::string content_type) = 0;
  virtual void send_chunk(std::string data) = 0;
  virtual void end_stream() = 0;
  // Runs once, on the connection's strand, if the client goes away before the response ends.
  virtual void on_disconnect(std::function<void()> fn) = 0;
};

using Handler = std::function<void(std::shared_ptr<Exchange>)>;

class HttpServer {
 public:
  HttpServer(boost::asio::io_context& io, HttpLimits limits, Handler handler);
  // Binds and starts accepting; returns the bound port (port 0: any free port).
  unsigned short listen(const std::string& host, unsigned short port);
  void stop_accepting();
  int open_connections() const { return open_->load(); }
  // Responses begun and not yet written out: a drain waits for these after the last request ends.
  int responses_in_flight() const { return busy_->load(); }

 private:
  void accept();
  void refuse(boost::asio::ip::tcp::socket sock);
  boost::asio::io_context& io_;
  HttpLimits limits_;
  Handler handler_;
  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer retry_;  // after a failed accept (out of descriptors): try again later
  std::shared_ptr<std::atomic<int>> open_ = std::make_shared<std::atomic<int>>(0);
  std::shared_ptr<std::atomic<int>> busy_ = std::make_shared<std::atomic<int>>(0);
  uint64_t accept_failures_ = 0, refused_ = 0;
};

// How many of `wanted` connections fit under the process's limit on open files, keeping
// `reserve` descriptors for everything else (model files, logs, event loops); the soft limit
// is first raised toward the hard one as far as needed. Returns at most `wanted`; 0 or less
// when not even one fits. `limit_out` receives the soft limit in force afterwards.
int fit_connections(int wanted, int reserve, long* limit_out = nullptr);

}  // namespace troupe::serve
