#include "engine/gradient_ring.h"

#include "core/error.h"

namespace sf {

GradientRing::GradientRing(std::vector<Buffer*> buffers) : bufs_(std::move(buffers)) {
  SF_CHECK(!bufs_.empty(), "a gradient ring needs buffers");
  owner_.assign(bufs_.size(), -1);
}

void GradientRing::reset(int n_units) {
  std::lock_guard<std::mutex> lk(mu_);
  owner_.assign(bufs_.size(), -1);
  slot_of_.assign(size_t(n_units), -1);
  next_ = 0;
  aborted_ = false;
}

void* GradientRing::claim(int unit) {
  std::unique_lock<std::mutex> lk(mu_);
  SF_CHECK(size_t(unit) < slot_of_.size() && slot_of_[size_t(unit)] < 0, "gradient ring: unit ", unit,
           " claimed twice in a step");
  const size_t s = next_;
  cv_.wait(lk, [&] { return aborted_ || owner_[s] < 0; });
  SF_CHECK(!aborted_, "gradient ring: the update of unit ", owner_[s], " failed");
  owner_[s] = unit;
  slot_of_[size_t(unit)] = int(s);
  next_ = (next_ + 1) % bufs_.size();
  return bufs_[s]->data();
}

void* GradientRing::of(int unit) const {
  std::lock_guard<std::mutex> lk(mu_);
  const int s = size_t(unit) < slot_of_.size() ? slot_of_[size_t(unit)] : -1;
  SF_CHECK(s >= 0, "gradient ring: unit ", unit, " has no gradient landed");
  return bufs_[size_t(s)]->data();
}

void GradientRing::release(int unit) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    const int s = slot_of_[size_t(unit)];
    SF_CHECK(s >= 0 && owner_[size_t(s)] == unit, "gradient ring: unit ", unit, " released without a claim");
    owner_[size_t(s)] = -1;
  }
  cv_.notify_all();
}

void GradientRing::abort() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    aborted_ = true;
  }
  cv_.notify_all();
}

}  // namespace sf
