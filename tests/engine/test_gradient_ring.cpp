// The gradient ring of the weights-from-the-master window (engine/gradient_ring.h): units
// take its buffers in turn, a buffer comes back only when its unit is released, and a failed
// update side wakes a claimer instead of leaving it blocked.
#include <gtest/gtest.h>

#include <thread>

#include "backend/host/host_backend.h"
#include "core/error.h"
#include "engine/gradient_ring.h"

namespace sf {
namespace {

struct Ring {
  HostBackend be;
  std::unique_ptr<Buffer> a = be.alloc_host(64, "ring 0"), b = be.alloc_host(64, "ring 1");
  GradientRing ring{{a.get(), b.get()}};
};

TEST(GradientRing, UnitsTakeTheBuffersInTurnAndWaitForTheirRelease) {
  Ring r;
  r.ring.reset(5);
  EXPECT_EQ(r.ring.claim(4), r.a->data());
  EXPECT_EQ(r.ring.claim(3), r.b->data());
  EXPECT_EQ(r.ring.of(4), r.a->data());
  // The third unit's buffer is unit 4's: it can only have it once unit 4 is released.
  void* got = nullptr;
  std::thread claimer([&] { got = r.ring.claim(2); });
  r.ring.release(4);
  claimer.join();
  EXPECT_EQ(got, r.a->data());
  EXPECT_EQ(r.ring.of(2), r.a->data());
  r.ring.release(3);
  r.ring.release(2);
  EXPECT_THROW(r.ring.claim(2), Error);  // once per unit and step
  EXPECT_THROW(r.ring.of(1), Error);     // nothing landed for unit 1
  r.ring.reset(5);                       // a new step
  EXPECT_EQ(r.ring.claim(2), r.a->data());
}

TEST(GradientRing, AbortWakesAWaitingClaimer) {
  Ring r;
  r.ring.reset(4);
  r.ring.claim(3);
  r.ring.claim(2);
  bool threw = false;
  std::thread claimer([&] {
    try {
      r.ring.claim(1);
    } catch (const Error&) {
      threw = true;
    }
  });
  r.ring.abort();
  claimer.join();
  EXPECT_TRUE(threw);
}

}  // namespace
}  // namespace sf
