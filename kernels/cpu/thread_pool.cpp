#include "kernels/cpu/thread_pool.h"

#include <immintrin.h>

#include <algorithm>
#include <thread>

namespace troupe::cpu {

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  for (int i = 1; i < num_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    // Spin for a while (a decode step issues the next region within microseconds), then sleep.
    uint64_t g = generation_.load(std::memory_order_acquire);
    // Past a few thousand pauses, yield each time: when the machine is oversubscribed the
    // thread we wait for may need this core.
    for (int spin = 0; g == seen && spin < 24000 && !parked_.load(std::memory_order_relaxed); ++spin) {
      if (spin < 4000)
        _mm_pause();
      else
        std::this_thread::yield();
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return generation_.load() != seen; });
      g = generation_.load();
    }
    seen = g;
    if (stop_.load()) return;
    (*job_)(index, num_threads_);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
  if (num_threads_ == 1) {
    fn(0, 1);
    return;
  }
  job_ = &fn;
  parked_.store(false, std::memory_order_relaxed);
  pending_.store(num_threads_ - 1, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  cv_.notify_all();
  fn(0, num_threads_);
  for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) {
    if (spin < 4000)
      _mm_pause();
    else
      std::this_thread::yield();  // a worker that lost its core gets it back sooner
  }
}

void ThreadPool::park() { parked_.store(true, std::memory_order_relaxed); }

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (num_threads_ == 1 || n == 1) {
    fn(0, n);
    return;
  }
  run([&](int t, int nt) {
    const int64_t begin = n * t / nt, end = n * (t + 1) / nt;
    if (begin < end) fn(begin, end);
  });
}

void ThreadPool::parallel_for_dynamic(int64_t n, const std::function<void(int64_t)>& fn) {
  parallel_for_chunks(n, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) fn(i);
  });
}

void ThreadPool::parallel_for_chunks(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (num_threads_ == 1 || n <= grain) {
    fn(0, n);
    return;
  }
  std::atomic<int64_t> next{0};
  run([&](int, int) {
    for (int64_t b = next.fetch_add(grain, std::memory_order_relaxed); b < n;
         b = next.fetch_add(grain, std::memory_order_relaxed))
      fn(b, std::min(n, b + grain));
  });
}

}  // namespace troupe::cpu
