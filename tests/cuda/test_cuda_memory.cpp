// CudaBackend memory accounting, copies, streams and events.
#include "cuda_test_util.h"

namespace sf::test {
namespace {

TEST(CudaMemory, AllocCountsBytesAndFrees) {
  SF_REQUIRE_GPU();
  CudaBackend& be = gpu();
  const size_t before = be.bytes_in_use();
  {
    auto a = be.alloc(1000, "a");
    auto b = be.alloc(1 << 20, "b");
    EXPECT_EQ(be.bytes_in_use(), before + 1024 + (1 << 20));  // rounded to 256 bytes
    EXPECT_GE(be.peak_bytes_in_use(), be.bytes_in_use());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % 256, 0u);
  }
  EXPECT_EQ(be.bytes_in_use(), before);
}

TEST(CudaMemory, BudgetIsEnforcedWithAClearError) {
  SF_REQUIRE_GPU();
  CudaBackend be(0, size_t(64) << 20);
  auto a = be.alloc(size_t(48) << 20, "first slot");
  try {
    be.alloc(size_t(32) << 20, "second slot");
    FAIL() << "allocation over the budget succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::out_of_memory);
    EXPECT_NE(std::string(e.what()).find("second slot"), std::string::npos) << e.what();
  }
}

TEST(CudaMemory, CopiesRoundTripAndFillZero) {
  SF_REQUIRE_GPU();
  CudaBackend& be = gpu();
  auto s = be.create_stream("copy");
  std::vector<float> src = random_vec(4099, 1), back(4099, -1.f);
  auto d1 = be.alloc(src.size() * 4, "d1"), d2 = be.alloc(src.size() * 4, "d2");
  be.copy_to_device(*s, d1->data(), src.data(), src.size() * 4);
  be.copy_on_device(*s, d2->data(), d1->data(), src.size() * 4);
  be.copy_to_host(*s, back.data(), d2->data(), src.size() * 4);
  s->synchronize();
  EXPECT_EQ(back, src);
  be.fill_zero(*s, d2->data(), 40);
  be.copy_to_host(*s, back.data(), d2->data(), src.size() * 4);
  s->synchronize();
  for (int i = 0; i < 10; ++i) EXPECT_EQ(back[size_t(i)], 0.f);
  EXPECT_EQ(back[10], src[10]);
}

TEST(CudaMemory, EventsOrderStreams) {
  SF_REQUIRE_GPU();
  CudaBackend& be = gpu();
  auto s1 = be.create_stream("producer"), s2 = be.create_stream("consumer");
  auto ev = be.create_event();
  const size_t n = size_t(64) << 20;  // long enough that s2 would overtake without the event
  auto a = be.alloc(n, "a"), b = be.alloc(n, "b");
  be.fill_zero(*s1, a->data(), n);
  std::vector<unsigned char> ones(n, 1);
  be.copy_to_device(*s1, a->data(), ones.data(), n);
  ev->record(*s1);
  ev->wait(*s2);
  be.copy_on_device(*s2, b->data(), a->data(), n);
  std::vector<unsigned char> back(n, 0);
  be.copy_to_host(*s2, back.data(), b->data(), n);
  s2->synchronize();
  EXPECT_TRUE(ev->query());
  EXPECT_EQ(back, ones);
}

TEST(CudaMemory, NameNamesTheDevice) {
  SF_REQUIRE_GPU();
  EXPECT_NE(gpu().name().find("cuda:0"), std::string::npos);
  EXPECT_EQ(gpu().compute_dtype(), DType::bf16);
}

}  // namespace
}  // namespace sf::test
