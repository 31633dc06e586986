#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>

namespace sf {

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  // The calling thread is worker 0; spawn the others.
  for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::worker(int) {
  uint64_t seen = 0;
  for (;;) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_work_.wait(lk, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    while (next_task_ < job_tasks_) {
      int64_t t = next_task_++;
      auto job = job_;
      lk.unlock();
      try {
        (*job)(t);
      } catch (...) {
        std::lock_guard<std::mutex> g(mu_);
        if (!error_) error_ = std::current_exception();
      }
      lk.lock();
      if (--pending_ == 0) cv_done_.notify_all();
    }
  }
}

void ThreadPool::run_tasks(int64_t n_tasks, const std::function<void(int64_t)>& fn) {
  if (n_tasks <= 0) return;
  std::unique_lock<std::mutex> lk(mu_);
  if (busy_ || n_threads_ == 1 || n_tasks == 1) {  // nested or trivial: run inline
    lk.unlock();
    for (int64_t t = 0; t < n_tasks; ++t) fn(t);
    return;
  }
  busy_ = true;
  job_ = &fn;
  job_tasks_ = n_tasks;
  next_task_ = 0;
  pending_ = n_tasks;
  error_ = nullptr;
  ++generation_;
  cv_work_.notify_all();
  // The caller works too.
  while (next_task_ < job_tasks_) {
    int64_t t = next_task_++;
    lk.unlock();
    try {
      fn(t);
    } catch (...) {
      std::lock_guard<std::mutex> g(mu_);
      if (!error_) error_ = std::current_exception();
    }
    lk.lock();
    --pending_;
  }
  cv_done_.wait(lk, [&] { return pending_ == 0; });
  job_ = nullptr;
  job_tasks_ = 0;
  busy_ = false;
  auto err = error_;
  error_ = nullptr;
  lk.unlock();
  if (err) std::rethrow_exception(err);
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                              int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  int64_t units = (n + grain - 1) / grain;
  int64_t parts = std::min<int64_t>(units, n_threads_);
  run_tasks(parts, [&](int64_t p) {
    int64_t u0 = units * p / parts, u1 = units * (p + 1) / parts;
    int64_t b = u0 * grain, e = std::min(n, u1 * grain);
    if (b < e) fn(b, e);
  });
}

ThreadPool& host_pool() {
  static ThreadPool pool([] {
    const char* s = std::getenv("SF_NUM_THREADS");
    return s ? std::atoi(s) : 0;
  }());
  return pool;
}

}  // namespace sf
