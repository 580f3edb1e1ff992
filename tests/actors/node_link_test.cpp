// The node link (actors/node_link.h) over loopback TCP: the handshake accepts the same key
// on both sides and refuses a wrong key, a wrong magic and silence before any frame is
// read; frames round-trip; an oversized or unknown frame, or one cut short, is an error
// (never an allocation of the claimed size).
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <future>
#include <thread>

#include "actors/node_link.h"

using namespace troupe;
using namespace troupe::link;

namespace {

// A connected pair over 127.0.0.1: (head's socket, node's socket).
std::pair<Socket, Socket> connected_pair() {
  Listener l;
  auto port = l.listen("127.0.0.1", 0);
  REQUIRE(port.ok());
  auto accepted = std::async(std::launch::async, [&] { return l.accept(5000); });
  auto head = connect_tcp("127.0.0.1", *port, 5000);
  REQUIRE(head.ok());
  auto node = accepted.get();
  REQUIRE(node.ok());
  return {std::move(*head), std::move(*node)};
}

const std::string kKey = "0123456789abcdef-the-shared-key";

}  // namespace

TEST_CASE("node link: the same key authenticates both sides", "[link]") {
  auto [head, node] = connected_pair();
  auto n = std::async(std::launch::async, [&node = node] { return authenticate_as_node(node, kKey); });
  const Status h = authenticate_as_head(head, kKey);
  const Status ns = n.get();
  INFO((h ? std::string() : h.error().message) << " / " << (ns ? std::string() : ns.error().message));
  REQUIRE(h.ok());
  REQUIRE(ns.ok());
  // then frames flow both ways
  Bytes payload(1000);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 7);
  REQUIRE(write_frame(head, Frame::Step, payload).ok());
  auto f = read_frame(node, 2000);
  REQUIRE(f.ok());
  REQUIRE(f->first == Frame::Step);
  REQUIRE(f->second == payload);
  REQUIRE(write_frame(node, Frame::StepResult, {}).ok());
  auto g = read_frame(head, 2000);
  REQUIRE(g.ok());
  REQUIRE(g->first == Frame::StepResult);
  REQUIRE(g->second.empty());
}

TEST_CASE("node link: a wrong key is refused on both sides", "[link]") {
  auto [head, node] = connected_pair();
  auto n = std::async(std::launch::async, [&node = node] {
    Status s = authenticate_as_node(node, kKey);
    node.shutdown();  // as troupe node does: close without a proof
    return s;
  });
  const Status h = authenticate_as_head(head, "another key of sixteen bytes or more");
  const Status ns = n.get();
  REQUIRE_FALSE(ns.ok());
  REQUIRE(ns.error().message.find("wrong key") != std::string::npos);
  REQUIRE_FALSE(h.ok());
  REQUIRE(h.error().message.find("did not accept the key") != std::string::npos);
}

TEST_CASE("node link: a wrong magic, or silence, ends the handshake", "[link]") {
  {
    auto [head, node] = connected_pair();
    auto n = std::async(std::launch::async, [&node = node] { return authenticate_as_node(node, kKey, 2000); });
    uint8_t greeting[40];
    REQUIRE(head.read_exact(greeting, sizeof greeting, 2000).ok());
    std::vector<uint8_t> junk(72, 'x');
    REQUIRE(head.write_all(junk.data(), junk.size()).ok());
    const Status ns = n.get();
    REQUIRE_FALSE(ns.ok());
    REQUIRE(ns.error().message.find("wrong magic") != std::string::npos);
  }
  {
    auto [head, node] = connected_pair();
    const Status ns = authenticate_as_node(node, kKey, 200);  // the head never answers
    REQUIRE_FALSE(ns.ok());
    REQUIRE(ns.error().message.find("timed out") != std::string::npos);
  }
  {
    auto [head, node] = connected_pair();
    const Status hs = authenticate_as_head(head, kKey, 200);  // the node never greets
    REQUIRE_FALSE(hs.ok());
    REQUIRE(hs.error().message.find("timed out") != std::string::npos);
  }
}

TEST_CASE("node link: oversized, unknown and truncated frames are errors", "[link][badinput]") {
  auto raw_header = [](uint32_t type, uint32_t len) {
    std::vector<uint8_t> h(8);
    for (int i = 0; i < 4; ++i) {
      h[i] = static_cast<uint8_t>(type >> (8 * i));
      h[4 + i] = static_cast<uint8_t>(len >> (8 * i));
    }
    return h;
  };
  {
    auto [a, b] = connected_pair();
    auto h = raw_header(3, 0xFFFFFFFFu);  // 4 GiB claimed
    REQUIRE(a.write_all(h.data(), h.size()).ok());
    auto f = read_frame(b, 2000);
    REQUIRE_FALSE(f.ok());
    REQUIRE(f.error().message.find("exceeds the link's limit") != std::string::npos);
  }
  {
    auto [a, b] = connected_pair();
    auto h = raw_header(99, 4);
    REQUIRE(a.write_all(h.data(), h.size()).ok());
    auto f = read_frame(b, 2000);
    REQUIRE_FALSE(f.ok());
    REQUIRE(f.error().message.find("unknown frame type") != std::string::npos);
  }
  {
    auto [a, b] = connected_pair();
    auto h = raw_header(3, 100);
    REQUIRE(a.write_all(h.data(), h.size()).ok());
    REQUIRE(a.write_all(h.data(), 8).ok());  // 8 of the 100 bytes, then the peer leaves
    a.shutdown();
    auto f = read_frame(b, 2000);
    REQUIRE_FALSE(f.ok());
    REQUIRE(f.error().message.find("closed") != std::string::npos);
  }
  {
    auto [a, b] = connected_pair();
    Bytes big(kMaxFrameBytes + 1);
    REQUIRE_FALSE(write_frame(a, Frame::Step, big).ok());  // refused before anything is sent
  }
}

TEST_CASE("node link: key files", "[link]") {
  const std::string path = "node_link_test.key";
  { std::ofstream(path) << "short\n"; }
  auto k = read_key_file(path);
  REQUIRE_FALSE(k.ok());
  REQUIRE(k.error().message.find("shorter than 16 bytes") != std::string::npos);
  { std::ofstream(path) << "0123456789abcdef0123\r\n"; }
  k = read_key_file(path);
  REQUIRE(k.ok());
  REQUIRE(*k == "0123456789abcdef0123");
  std::remove(path.c_str());
  REQUIRE_FALSE(read_key_file(path).ok());
}
