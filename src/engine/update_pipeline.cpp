#include "engine/update_pipeline.h"

#include <algorithm>
#include <chrono>

#include "core/stopwatch.h"

namespace sf {

UpdatePipeline::UpdatePipeline() : thread_([this] { loop(); }) {}

UpdatePipeline::~UpdatePipeline() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

void UpdatePipeline::loop() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      work_cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopped, and nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

void UpdatePipeline::post(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    jobs_.push_back(std::move(job));
  }
  work_cv_.notify_all();
}

void UpdatePipeline::start(std::vector<int> order, std::function<void(int)> update, std::function<void()> after) {
  wait_all();
  int n = order.empty() ? 0 : *std::max_element(order.begin(), order.end()) + 1;
  {
    std::lock_guard<std::mutex> lk(mu_);
    done_.assign(size_t(n), 0);
    finished_ = false;
    error_ = nullptr;
  }
  post([this, order = std::move(order), update = std::move(update), after = std::move(after)] {
    run_round(order, update, after);
  });
}

void UpdatePipeline::run_round(const std::vector<int>& order, const std::function<void(int)>& update,
                               const std::function<void()>& after) {
  auto t0 = std::chrono::steady_clock::now();
  for (int u : order) {
    try {
      update(u);
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu_);
      if (!error_) error_ = std::current_exception();
    }
    std::lock_guard<std::mutex> lk(mu_);
    done_[size_t(u)] = 1;
    cv_.notify_all();
  }
  if (after) try {
      after();
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu_);
      if (!error_) error_ = std::current_exception();
    }
  std::lock_guard<std::mutex> lk(mu_);
  round_seconds_ = seconds_since(t0);
  finished_ = true;
  cv_.notify_all();
}

double UpdatePipeline::take_wait_seconds() {
  std::lock_guard<std::mutex> lk(mu_);
  double s = wait_seconds_;
  wait_seconds_ = 0;
  return s;
}

void UpdatePipeline::wait(int unit) {
  auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] {
    return finished_ || (size_t(unit) < done_.size() && done_[size_t(unit)]);
  });
  wait_seconds_ += seconds_since(t0);
  if (error_) {
    lk.unlock();
    wait_all();  // the round ends, then its error is rethrown (and cleared)
  }
}

void UpdatePipeline::wait_all() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return finished_; });
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

}  // namespace sf
