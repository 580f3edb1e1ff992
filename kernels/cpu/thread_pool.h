// A small fork-join pool for the CPU backend. Decode runs a few hundred parallel regions
// per token, so workers spin briefly on an atomic generation counter before sleeping;
// the calling thread takes part as worker 0. Work is split statically (parallel_for) or
// handed out from a shared counter (parallel_for_dynamic / _chunks); either way which
// thread computes a row never changes a result (every row is computed the same way by anyone).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace troupe::cpu {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return num_threads_; }
  // Calls fn(thread_index, num_threads) on every thread and returns when all are done.
  void run(const std::function<void(int, int)>& fn);
  // Splits [0, n) into one contiguous range per thread: fn(begin, end).
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn);
  // Hands out items [0, n) one at a time from a shared counter: for items of very
  // different cost (causal attention tiles). Each item must write only its own outputs.
  void parallel_for_dynamic(int64_t n, const std::function<void(int64_t)>& fn);
  // Hands out [0, n) in ranges of `grain` from a shared counter: fn(begin, end). For even
  // work on a machine the pool shares with other threads (a server): a thread that loses
  // its core for a while leaves its ranges to the others instead of stalling the region.
  void parallel_for_chunks(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);
  // The idle workers sleep now instead of spinning for the next region (the caller knows it
  // will not issue one for a while); the next region wakes them.
  void park();

 private:
  void worker(int index);
  int num_threads_;
  std::vector<std::thread> threads_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> parked_{false};
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace troupe::cpu
