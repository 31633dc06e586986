// A fixed pool of worker threads for data-parallel host loops.
// parallel_for splits [0, n) into at most size() contiguous ranges, statically, so a
// result never depends on scheduling; callers that reduce must reduce per range in order.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace sf {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads <= 0: hardware concurrency
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(begin, end) over disjoint ranges covering [0, n); each range has a multiple of
  // `grain` elements (but the last). Blocks until all ranges are done. Exceptions thrown by
  // fn are rethrown here (the first one). Not reentrant: fn must not call parallel_for on the
  // same pool (it then runs inline).
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn,
                    int64_t grain = 1);

  // Runs fn(task) for task in [0, n_tasks), tasks spread over the workers.
  void run_tasks(int64_t n_tasks, const std::function<void(int64_t)>& fn);

 private:
  void worker(int index);

  int n_threads_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  const std::function<void(int64_t)>* job_ = nullptr;
  int64_t job_tasks_ = 0;
  int64_t next_task_ = 0;
  int64_t pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  bool busy_ = false;
  std::exception_ptr error_;
};

// The process-wide pool for host compute (sized by SF_NUM_THREADS or the core count).
ThreadPool& host_pool();

}  // namespace sf
