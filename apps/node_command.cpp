// `troupe node`: a stage node. It loads the model and waits for a head (`troupe serve
// --remote-stage K=HOST:PORT`) to connect over an authenticated node link
// (actors/node_link.h); the head's hello names the layers and the KV pool, the node builds
// that stage and runs the head's steps until the link ends, then frees the stage and
// waits for the next head (a restarted head connects again). One head at a time: another
// one is told the node is busy.
#include <spdlog/spdlog.h>

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <mutex>
#include <thread>
#include <vector>

#include "actors/codec.h"
#include "actors/remote_stage.h"
#include "apps/common.h"
#include "apps/subcommands.h"

namespace troupe::app {
namespace {

struct NodeFlags {
  ModelFlags model;
  std::string model_positional;
  std::string host = "127.0.0.1";
  int port = 7433;
  std::string key_file;
  std::string port_file;
};

std::atomic<bool> g_stop{false};

extern "C" void on_signal(int) { g_stop.store(true); }

// The connections being handled: one thread each, so that a slow or hostile client never
// holds up the accept loop; at most one of them runs a stage at a time.
class Links {
 public:
  void add(std::shared_ptr<link::Socket> s, std::thread t) {
    std::lock_guard<std::mutex> lk(mu_);
    open_.push_back({std::move(s), std::move(t)});
    reap_locked();
  }
  bool try_claim() { return !busy_.exchange(true); }
  void release() { busy_.store(false); }
  void finished(const link::Socket* s) {
    std::lock_guard<std::mutex> lk(mu_);
    done_.push_back(s);
  }
  // Ends every link (their reads fail at once) and waits for their threads.
  void close_all() {
    std::vector<Entry> all;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& e : open_) e.socket->shutdown();
      all.swap(open_);
    }
    for (auto& e : all) e.thread.join();
  }

 private:
  struct Entry {
    std::shared_ptr<link::Socket> socket;
    std::thread thread;
  };
  // Joins the finished threads (and closes their sockets). A thread may finish before its
  // entry is added: its mark then waits for the next call.
  void reap_locked() {
    for (auto d = done_.begin(); d != done_.end();) {
      auto it = std::find_if(open_.begin(), open_.end(), [&](const Entry& e) { return e.socket.get() == *d; });
      if (it == open_.end()) {
        ++d;
        continue;
      }
      it->thread.join();
      open_.erase(it);
      d = done_.erase(d);
    }
  }
  std::mutex mu_;
  std::vector<Entry> open_;
  std::vector<const link::Socket*> done_;
  std::atomic<bool> busy_{false};
};

int node(NodeFlags f) {
  if (!f.model_positional.empty()) f.model.model = f.model_positional;
  if (f.port < 0 || f.port > 65535) {
    spdlog::error("--port must be 0..65535");
    return 2;
  }
  auto key = link::read_key_file(f.key_file);
  if (!key) {
    spdlog::error("{}", key.error().message);
    return 2;
  }
  auto files = open_model_files(f.model);
  if (!files) {
    spdlog::error("{}", files.error().message);
    return 1;
  }
  files->config.max_context = std::min<int32_t>(files->config.max_context, f.model.ctx);
  link::Listener listener;
  auto port = listener.listen(f.host, f.port);
  if (!port) {
    spdlog::error("{}", port.error().message);
    return 1;
  }
  if (!f.port_file.empty()) {
    FILE* pf = std::fopen(f.port_file.c_str(), "w");
    if (pf) {
      std::fprintf(pf, "%d\n", *port);
      std::fclose(pf);
    }
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  caf::actor_system_config cfg;
  configure_actor_system(cfg);
  caf::actor_system sys{cfg};
  actors::StageNodeOptions opt;
  opt.device = f.model.device;
  opt.threads = f.model.threads;
  opt.cuda = f.model.cuda_options();
  opt.max_batch_tokens = f.model.batch;
  spdlog::info("stage node for '{}' ({} layers) listening on {}:{}", files->path, files->config.num_layers, f.host,
               *port);
  if (!is_loopback(f.host))
    spdlog::warn("the node link authenticates heads but does not encrypt: bind {} only on a trusted network", f.host);
  Links links;
  auto handle = [&](std::shared_ptr<link::Socket> sock) {
    const std::string peer = sock->peer();
    if (auto ok = link::authenticate_as_node(*sock, *key); !ok) {
      spdlog::warn("connection from {} refused: {}", peer, ok.error().message);
    } else if (!links.try_claim()) {
      // Authenticated, but the stage is taken: say so in the hello's answer.
      actors::NodeHelloReply r{"this node already runs a stage for another head", actors::model_fingerprint(*files),
                               ""};
      (void)link::read_frame(*sock, 5000);
      (void)link::write_frame(*sock, link::Frame::HelloReply, codec::encode(r));
      spdlog::warn("head {} refused: busy with another head", peer);
    } else {
      spdlog::info("head {} connected", peer);
      auto ended = actors::serve_stage_link(sys, *sock, *files, opt);
      spdlog::info("link to head {} ended: {}", peer, ended ? std::string("closed") : ended.error().message);
      links.release();
    }
    sock->shutdown();
    links.finished(sock.get());
  };
  while (!g_stop.load()) {
    auto sock = listener.accept(500);
    if (!sock) continue;  // timed out (or a transient accept error): check for a signal, wait again
    auto shared = std::make_shared<link::Socket>(std::move(*sock));
    links.add(shared, std::thread(handle, shared));
  }
  links.close_all();
  spdlog::info("stopped");
  return 0;
}

}  // namespace

void add_node_command(CLI::App& app) {
  auto f = std::make_shared<NodeFlags>();
  CLI::App* cmd = app.add_subcommand(
      "node", "Run pipeline stages for a head in another process or machine (troupe serve --remote-stage K=HOST:PORT)");
  f->model.add_to(*cmd);
  cmd->add_option("model", f->model_positional, "model (same as --model); the head must serve the same file");
  cmd->add_option("--host", f->host, "address to listen on for heads (loopback by default)")->capture_default_str();
  cmd->add_option("--port", f->port, "TCP port for heads (0: any free port)")->capture_default_str();
  cmd->add_option(
         "--key-file", f->key_file,
         "file holding the shared node key (at least 16 bytes; the head's --node-key-file must hold the same): "
         "a head must prove it holds the key before anything it sends is decoded")
      ->required();
  cmd->add_option("--port-file", f->port_file, "write the bound port to this file once listening (for --port 0)");
  cmd->callback([f] { set_exit_code(node(*f)); });
}

}  // namespace troupe::app
