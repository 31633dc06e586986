#include "engine/update_pipeline.h"

#include <algorithm>
#include <chrono>

#include "core/stopwatch.h"

namespace sf {

UpdatePipeline::~UpdatePipeline() {
  if (thread_.joinable()) thread_.join();
}

void UpdatePipeline::start(std::vector<int> order, std::function<void(int)> update) {
  wait_all();
  int n = order.empty() ? 0 : *std::max_element(order.begin(), order.end()) + 1;
  {
    std::lock_guard<std::mutex> lk(mu_);
    done_.assign(size_t(n), 0);
    finished_ = false;
    error_ = nullptr;
  }
  thread_ = std::thread([this, order = std::move(order), update = std::move(update)] {
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
    std::lock_guard<std::mutex> lk(mu_);
    round_seconds_ = seconds_since(t0);
    finished_ = true;
    cv_.notify_all();
  });
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
    auto e = error_;
    lk.unlock();
    wait_all();
    std::rethrow_exception(e);
  }
}

void UpdatePipeline::wait_all() {
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lk(mu_);
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

}  // namespace sf
