// SharedRegion: one region by name, mapped twice (as two ranks would: the kernel's sharing is
// by name, the same in one process or two), the creator's unlink and clean-up, and the
// refusals (a taken name, a missing one, a size mismatch, too little /dev/shm).
#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "dist/shared_memory.h"
#include "dist/dist_test_util.h"

namespace sf::dist {
namespace {
using test::message_of;

std::string fresh_name(const char* what) { return shared_region_name(new_run_id(), what); }

TEST(SharedRegion, TwoMappingsOfOneNameShareTheBytes) {
  const std::string name = fresh_name("state");
  SharedRegion rank0 = SharedRegion::create(name, 1 << 20);
  auto* a = static_cast<uint32_t*>(rank0.data());
  for (uint32_t i = 0; i < (1u << 18); ++i) a[i] = i * 2654435761u;
  SharedRegion rank1 = SharedRegion::open(name, 1 << 20);
  ASSERT_NE(rank1.data(), rank0.data()) << "a second mapping, as another process has";
  EXPECT_EQ(std::memcmp(rank1.data(), rank0.data(), 1 << 20), 0);
  static_cast<uint32_t*>(rank1.data())[7] = 12345;  // rank 1 updates its slice
  EXPECT_EQ(a[7], 12345u);
  rank0.unlink();
  // The name is gone, the memory is not.
  EXPECT_NE(message_of([&] { SharedRegion::open(name, 1 << 20); }).find("does not exist"), std::string::npos);
  a[9] = 777;
  EXPECT_EQ(static_cast<uint32_t*>(rank1.data())[9], 777u);
  EXPECT_NO_THROW(rank0.unlink()) << "idempotent";
}

TEST(SharedRegion, ACreatorThatFailsBeforeUnlinkLeavesNothing) {
  const std::string name = fresh_name("homes");
  { SharedRegion r = SharedRegion::create(name, 4096); }
  EXPECT_NE(message_of([&] { SharedRegion::open(name, 4096); }).find("does not exist"), std::string::npos);
}

TEST(SharedRegion, RefusesATakenNameAMissingOneAndAnotherSize) {
  const std::string name = fresh_name("state");
  SharedRegion r = SharedRegion::create(name, 8192);
  const std::string taken = message_of([&] { SharedRegion::create(name, 8192); });
  EXPECT_NE(taken.find("already exists"), std::string::npos) << taken;
  EXPECT_NE(taken.find("remove /dev/shm" + name), std::string::npos) << taken;
  const std::string size = message_of([&] { SharedRegion::open(name, 4096); });
  EXPECT_NE(size.find("holds 8192 bytes, this rank expects 4096"), std::string::npos) << size;
  const std::string missing = message_of([] { SharedRegion::open("/slideformer-no-such-run-state", 4096); });
  EXPECT_NE(missing.find("local rank 0 has not created it"), std::string::npos) << missing;
  EXPECT_THROW(SharedRegion::open("no-slash", 4096), Error);
  SharedRegion reader = SharedRegion::open(name, 8192);
  EXPECT_THROW(reader.unlink(), Error) << "only the creator unlinks";
}

TEST(SharedRegion, MoreThanDevShmHoldsIsRefusedBeforeAnyAllocation) {
  const size_t free_bytes = shm_free_bytes();
  if (free_bytes == 0) GTEST_SKIP() << "no /dev/shm here";
  const std::string name = fresh_name("state");
  try {
    SharedRegion::create(name, free_bytes + (size_t(1) << 30));
    FAIL() << "created more than /dev/shm holds";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::out_of_memory);
    EXPECT_NE(std::string(e.what()).find("--shm-size"), std::string::npos) << e.what();
  }
  EXPECT_NE(message_of([&] { SharedRegion::open(name, 4096); }).find("does not exist"), std::string::npos)
      << "the refused region's name is removed";
}

TEST(SharedRegion, RunIdsAndNames) {
  const std::string a = new_run_id(), b = new_run_id();
  EXPECT_EQ(a.size(), 16u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos) << a;
  EXPECT_NE(a, b);
  EXPECT_EQ(shared_region_name("00ff", "state"), "/slideformer-00ff-state");
}

}  // namespace
}  // namespace sf::dist
