// ThreadedStreamsBackend: ops run later, on the stream's thread, in stream order; an event
// orders two streams; without the wait the consumer really does see the old data (the check
// can fail); errors come back at synchronize; freeing memory waits for the streams. Lazy
// streams: a missing wait or synchronize shows on every run, however long the host takes
// (no timeout), and a host polling query() is caught by a count of polls, not a clock.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "backend/host/host_backend.h"
#include "backend/threaded_streams_backend.h"
#include "core/error.h"

using namespace sf;

namespace {

// A stream held at a gate: ops enqueued behind it wait until open() is called.
struct Gate {
  std::promise<void> p;
  std::shared_future<void> f = p.get_future().share();
  void hold(ThreadedStreamsBackend& be, Stream& s) {
    be.enqueue(s, [f = f] { f.wait(); });
  }
  void open() { p.set_value(); }
};

TEST(ThreadedStreams, OpsRunLaterInStreamOrder) {
  HostBackend host;
  ThreadedStreamsBackend be(host, {3, 50});
  auto s = be.create_stream("s");
  std::vector<float> src(1000, 2.f), dst(1000, 0.f);
  auto buf = be.alloc(src.size() * 4, "buf");
  Gate g;
  g.hold(be, *s);
  be.copy_to_device(*s, buf->data(), src.data(), src.size() * 4);
  be.copy_to_host(*s, dst.data(), buf->data(), dst.size() * 4);
  EXPECT_EQ(dst[0], 0.f);  // enqueued, not run: the stream is held
  g.open();
  s->synchronize();
  EXPECT_EQ(dst, src);
}

TEST(ThreadedStreams, EventOrdersTwoStreamsAndAMissingWaitShows) {
  HostBackend host;
  ThreadedStreamsBackend be(host, {5, 0});
  auto prod = be.create_stream("producer"), cons = be.create_stream("consumer");
  auto ev = be.create_event();
  std::vector<float> ones(256, 1.f), got(256, -1.f);
  auto buf = be.alloc(256 * 4, "buf");
  be.fill_zero(*cons, buf->data(), 256 * 4);
  cons->synchronize();
  for (bool wait : {false, true}) {
    Gate g;
    g.hold(be, *prod);
    be.copy_to_device(*prod, buf->data(), ones.data(), 256 * 4);
    ev->record(*prod);
    EXPECT_FALSE(ev->query());
    if (wait) ev->wait(*cons);
    be.copy_to_host(*cons, got.data(), buf->data(), 256 * 4);
    if (!wait) {
      cons->synchronize();  // the consumer ran while the producer is still held
      EXPECT_EQ(got[0], 0.f) << "no wait: the old data";
      g.open();
      ev->synchronize();
      EXPECT_TRUE(ev->query());
      be.fill_zero(*prod, buf->data(), 256 * 4);
      prod->synchronize();
    } else {
      g.open();
      cons->synchronize();
      EXPECT_EQ(got, ones) << "waited: the producer's data";
    }
  }
}

// Lazy streams run an op only when something waits for it: a consumer that does not wait for
// its producer reads the old data every time, and one that waits forces the producer to run.
TEST(ThreadedStreams, LazyStreamsShowAMissingWaitDeterministically) {
  HostBackend host;
  ThreadedStreamsBackend::Options o;
  o.lazy = true;
  ThreadedStreamsBackend be(host, o);
  auto prod = be.create_stream("producer"), cons = be.create_stream("consumer");
  auto ev = be.create_event();
  auto buf = be.alloc(64 * 4, "buf");
  std::vector<float> ones(64, 1.f), got(64, -1.f);
  be.fill_zero(*cons, buf->data(), 64 * 4);
  cons->synchronize();
  for (int round = 0; round < 20; ++round) {
    be.copy_to_device(*prod, buf->data(), ones.data(), 64 * 4);
    ev->record(*prod);
    be.copy_to_host(*cons, got.data(), buf->data(), 64 * 4);
    cons->synchronize();
    ASSERT_EQ(got[0], 0.f) << "round " << round << ": the producer ran unasked";
    EXPECT_FALSE(ev->query());
    ev->wait(*cons);
    be.copy_to_host(*cons, got.data(), buf->data(), 64 * 4);
    cons->synchronize();
    ASSERT_EQ(got, ones) << "round " << round;
    EXPECT_TRUE(ev->query());
    be.fill_zero(*prod, buf->data(), 64 * 4);
    prod->synchronize();
  }
}

// A lazy stream does not run an op by itself, however long the host takes: a host read that
// forgot its synchronize sees the old data, and time cannot hide it (the sleep is longer than
// the 50 ms timeout lazy streams used to have; a pass does not depend on it).
TEST(ThreadedStreams, LazyStreamsShowAMissingSynchronizeWhateverTheDelay) {
  HostBackend host;
  ThreadedStreamsBackend::Options o;
  o.lazy = true;
  ThreadedStreamsBackend be(host, o);
  auto s = be.create_stream("s");
  std::vector<float> src(16, 7.f), dst(16, 0.f);
  auto buf = be.alloc(64, "buf");
  be.copy_to_device(*s, buf->data(), src.data(), 64);
  be.copy_to_host(*s, dst.data(), buf->data(), 64);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(dst[0], 0.f) << "the stream ran without being asked";
  s->synchronize();
  EXPECT_EQ(dst, src);
  EXPECT_EQ(be.ops_run_unforced(), 0u);
}

// A host that polls query() for work nothing waits for would spin forever on lazy streams
// (a GPU would get there by itself). After lazy_poll_limit unanswered polls of one record its
// stream is made to run up to the record, and the ops that forced are counted: the engine's
// tests expect 0. Below the limit nothing runs. Counts, not times: deterministic.
TEST(ThreadedStreams, LazyStreamsCatchAHostPollingForProgress) {
  HostBackend host;
  ThreadedStreamsBackend::Options o;
  o.lazy = true;
  o.lazy_poll_limit = 50;
  ThreadedStreamsBackend be(host, o);
  auto s = be.create_stream("s");
  auto ev = be.create_event();
  std::vector<float> src(16, 7.f), dst(16, 0.f);
  auto buf = be.alloc(64, "buf");
  be.copy_to_device(*s, buf->data(), src.data(), 64);
  s->synchronize();  // waited for: not counted
  std::atomic<bool> ran{false};
  be.enqueue(*s, [&] { ran = true; });
  be.copy_to_host(*s, dst.data(), buf->data(), 64);
  ev->record(*s);
  for (int i = 0; i + 1 < o.lazy_poll_limit; ++i) ASSERT_FALSE(ev->query()) << "poll " << i;
  EXPECT_FALSE(ran) << "a poll below the limit made the stream run";
  EXPECT_EQ(be.ops_run_unforced(), 0u);
  EXPECT_FALSE(ev->query());  // the limit: forced, not yet run (it returns before the stream runs)
  EXPECT_EQ(be.ops_run_unforced(), 3u) << "the enqueued op, the copy and the event's marker";
  ev->synchronize();
  EXPECT_TRUE(ran);
  EXPECT_EQ(dst, src);
  EXPECT_TRUE(ev->query());
  EXPECT_EQ(be.ops_run_unforced(), 3u);
  // Polls of a record that is forced already add nothing, reached or not: here `later`'s
  // polls forced the stream past ev's record (the op, ev's marker, later's marker).
  be.enqueue(*s, [] {});
  ev->record(*s);
  auto later = be.create_event();
  later->record(*s);
  for (int i = 0; i < o.lazy_poll_limit; ++i) later->query();
  EXPECT_EQ(be.ops_run_unforced(), 6u);
  for (int i = 0; i < 2 * o.lazy_poll_limit; ++i) ev->query();
  EXPECT_EQ(be.ops_run_unforced(), 6u);
  later->synchronize();
  EXPECT_TRUE(ev->query());
}

TEST(ThreadedStreams, ErrorsComeBackAtSynchronize) {
  HostBackend host;
  ThreadedStreamsBackend be(host);
  auto s = be.create_stream("s");
  auto a = be.alloc(16 * 4, "a");
  Mat m(a->data(), DType::f32, 4, 4), wrong(a->data(), DType::f32, 3, 4);
  be.gemm(*s, m, m, Trans::no, wrong, Trans::no, 1.f, 0.f);  // 4x4 @ 3x4: bad shapes
  EXPECT_THROW(s->synchronize(), Error);
  s->synchronize();  // reported once
}

// Freeing memory drains every stream first. Lazy: the copy behind the buffer runs only
// because the free waits for it, so a free that did not wait leaves `ran` false on every run.
// Eager: the stream is held at a gate that another thread opens later; the free must block
// until then (without the wait the copy would write freed memory).
TEST(ThreadedStreams, FreeingMemoryWaitsForTheStreams) {
  for (bool lazy : {true, false}) {
    SCOPED_TRACE(lazy ? "lazy" : "eager");
    HostBackend host;
    ThreadedStreamsBackend::Options o;
    o.lazy = lazy;
    ThreadedStreamsBackend be(host, o);
    auto s = be.create_stream("s");
    std::vector<float> src(4096, 3.f);
    std::atomic<bool> ran{false};
    Gate g;
    std::thread opener;
    {
      auto buf = be.alloc(src.size() * 4, "buf");
      if (!lazy) g.hold(be, *s);
      be.copy_to_device(*s, buf->data(), src.data(), src.size() * 4);
      be.enqueue(*s, [&] { ran = true; });
      if (!lazy)
        opener = std::thread([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          g.open();
        });
    }  // blocks until the copy ran (else it would write freed memory)
    EXPECT_TRUE(ran);
    EXPECT_EQ(host.bytes_in_use(), 0u);
    if (opener.joinable()) opener.join();
    EXPECT_EQ(be.ops_run_unforced(), 0u);
  }
}

}  // namespace
