#include "backend/threaded_streams_backend.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <random>
#include <thread>
#include <vector>

#include "core/error.h"

namespace sf {

// A stream's queue and counters, shared with the events recorded on it (an event may
// outlive its stream, and may have to force it to run).
struct ThreadedStreamsBackend::Queue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> ops;
  uint64_t posted = 0, done = 0;
  uint64_t forced = 0;  // lazy: ops [done, forced) must run now; later ones wait (done <= forced)
  bool stop = false;
  std::exception_ptr error;

  uint64_t push(std::function<void()> fn) {
    uint64_t n;
    {
      std::lock_guard<std::mutex> lk(mu);
      ops.push_back(std::move(fn));
      n = ++posted;
    }
    cv.notify_all();
    return n;
  }
  // Something waits for the first `upto` ops of this stream. Returns how many ops that
  // forces which nothing had forced before.
  uint64_t force(uint64_t upto) {
    uint64_t added = 0;
    {
      std::lock_guard<std::mutex> lk(mu);
      if (upto > forced) added = upto - forced;
      forced = std::max(forced, upto);
    }
    cv.notify_all();
    return added;
  }
  // Waits until everything enqueued so far has run (and made it run).
  std::unique_lock<std::mutex> drain() {
    std::unique_lock<std::mutex> lk(mu);
    const uint64_t target = posted;
    forced = std::max(forced, target);
    cv.notify_all();
    cv.wait(lk, [&] { return done >= target; });
    return lk;
  }
};

// A stream: a thread that runs its queue in order. Destruction drains the queue.
class ThreadedStreamsBackend::Worker final : public Stream {
 public:
  Worker(std::shared_ptr<Queue> q, uint64_t seed, const Options& o) : q_(std::move(q)) {
    thread_ = std::thread([this, seed, o] { run(seed, o); });
  }
  ~Worker() override {
    {
      std::lock_guard<std::mutex> lk(q_->mu);
      q_->stop = true;
      q_->forced = q_->posted;
    }
    q_->cv.notify_all();
    thread_.join();
  }
  const std::shared_ptr<Queue>& queue() const { return q_; }

  // Waits until everything enqueued so far has run; rethrows the first error an op threw.
  void synchronize() override {
    auto lk = q_->drain();
    if (q_->error) {
      auto e = q_->error;
      q_->error = nullptr;
      std::rethrow_exception(e);
    }
  }

 private:
  void run(uint64_t seed, Options o) {
    std::mt19937_64 rng(seed);
    Queue& q = *q_;
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lk(q.mu);
        // Lazy: an op nothing waits for stays queued until something does, however long.
        q.cv.wait(lk, [&] { return q.stop || (!q.ops.empty() && (!o.lazy || q.done < q.forced)); });
        if (q.ops.empty()) return;  // stopping, and drained
        fn = std::move(q.ops.front());
        q.ops.pop_front();
      }
      if (o.max_jitter_us > 0)
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % uint64_t(o.max_jitter_us + 1)));
      try {
        fn();
      } catch (...) {
        std::lock_guard<std::mutex> lk(q.mu);
        if (!q.error) q.error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lk(q.mu);
        ++q.done;
      }
      q.cv.notify_all();
    }
  }

  std::shared_ptr<Queue> q_;
  std::thread thread_;
};

namespace {

using Worker = ThreadedStreamsBackend::Worker;

Worker& worker_of(Stream& s) {
  auto* w = dynamic_cast<Worker*>(&s);
  SF_CHECK(w, "threaded streams backend: a stream from another backend was passed");
  return *w;
}

// Record k of an event is reached when its marker has run on the recording stream. A wait
// or synchronize refers to the latest record at the time of the call (CUDA's semantics: a
// later record does not move an earlier wait's target); before any record, it is a no-op.
struct EventState {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<char> reached{1};  // reached[k] for record k; [0]: "never recorded", done
  std::vector<uint64_t> polls{0};  // lazy: query() calls that found record k not reached
  // Record k's stream and its marker's place in that stream (lazy streams are forced so far).
  std::vector<std::pair<std::shared_ptr<ThreadedStreamsBackend::Queue>, uint64_t>> where{{}};
};

// Makes the stream of record k run up to its marker (a no-op when not lazy). Returns how
// many ops that forced which nothing had forced before.
uint64_t force_record(EventState& st, uint64_t k) {
  std::shared_ptr<ThreadedStreamsBackend::Queue> q;
  uint64_t upto;
  {
    std::lock_guard<std::mutex> lk(st.mu);
    q = st.where[k].first;
    upto = st.where[k].second;
  }
  return q ? q->force(upto) : 0;
}

class ThreadedEvent final : public Event {
 public:
  // poll_limit > 0 (lazy): query() forces a record after that many unanswered polls and
  // counts what it forced in `unforced`.
  ThreadedEvent(int poll_limit, std::shared_ptr<std::atomic<uint64_t>> unforced)
      : poll_limit_(poll_limit), unforced_(std::move(unforced)) {}
  void record(Stream& s) override {
    auto& q = worker_of(s).queue();
    std::lock_guard<std::mutex> lk(st_->mu);  // the marker's place is known before it can run
    const uint64_t k = st_->reached.size();
    st_->reached.push_back(0);
    st_->polls.push_back(0);
    st_->where.emplace_back(q, 0);
    st_->where[k].second = q->push([st = st_, k] {
      {
        std::lock_guard<std::mutex> lk2(st->mu);
        st->reached[k] = 1;
      }
      st->cv.notify_all();
    });
  }
  void wait(Stream& s) override {
    const uint64_t k = latest();
    if (k == 0) return;
    worker_of(s).queue()->push([st = st_, k] {
      force_record(*st, k);
      std::unique_lock<std::mutex> lk(st->mu);
      st->cv.wait(lk, [&] { return st->reached[k] != 0; });
    });
  }
  void synchronize() override {
    const uint64_t k = latest();
    force_record(*st_, k);
    std::unique_lock<std::mutex> lk(st_->mu);
    st_->cv.wait(lk, [&] { return st_->reached[k] != 0; });
  }
  bool query() override {
    uint64_t k;
    {
      std::lock_guard<std::mutex> lk(st_->mu);
      k = st_->reached.size() - 1;
      if (st_->reached[k]) return true;
      if (poll_limit_ <= 0 || ++st_->polls[k] < uint64_t(poll_limit_)) return false;
    }
    // Polled too often: a host waiting for progress it never asked for. Run the stream up to
    // the record (else the poll would spin forever) and count it; 0 if something had forced
    // it in the meantime.
    *unforced_ += force_record(*st_, k);
    return false;  // it comes true once the marker has run
  }

 private:
  uint64_t latest() {
    std::lock_guard<std::mutex> lk(st_->mu);
    return st_->reached.size() - 1;
  }
  int poll_limit_;
  std::shared_ptr<std::atomic<uint64_t>> unforced_;
  std::shared_ptr<EventState> st_ = std::make_shared<EventState>();
};

// Memory whose release first waits for every stream (an op may still use it).
class DrainedBuffer final : public Buffer {
 public:
  DrainedBuffer(std::function<void()> drain, std::unique_ptr<Buffer> in)
      : drain_(std::move(drain)), in_(std::move(in)) {}
  ~DrainedBuffer() override { drain_(); }
  void* data() const override { return in_->data(); }
  size_t bytes() const override { return in_->bytes(); }

 private:
  std::function<void()> drain_;
  std::unique_ptr<Buffer> in_;
};

}  // namespace

ThreadedStreamsBackend::ThreadedStreamsBackend(Backend& inner, Options o)
    : ForwardingBackend(inner), opt_(o) {
  in_.default_stream();  // created here, not by two workers at once
  default_ = create_stream("default");
}

ThreadedStreamsBackend::~ThreadedStreamsBackend() { default_.reset(); }

std::unique_ptr<Stream> ThreadedStreamsBackend::create_stream(const std::string&) {
  auto q = std::make_shared<Queue>();
  std::lock_guard<std::mutex> lk(mu_);
  live_.push_back(q);
  return std::make_unique<Worker>(std::move(q), opt_.seed + n_streams_++, opt_);
}

std::unique_ptr<Event> ThreadedStreamsBackend::create_event() {
  return std::make_unique<ThreadedEvent>(opt_.lazy ? std::max(1, opt_.lazy_poll_limit) : 0, unforced_);
}

Stream& ThreadedStreamsBackend::default_stream() { return *default_; }

void ThreadedStreamsBackend::enqueue(Stream& s, std::function<void()> fn) {
  worker_of(s).queue()->push(std::move(fn));
}

void ThreadedStreamsBackend::run_op(Stream& s, std::string, Op op) {
  worker_of(s).queue()->push([this, op = std::move(op)] { op(in_, in_.default_stream()); });
}

// Drains every stream (queues of destroyed streams are dropped here; they drained then).
void ThreadedStreamsBackend::synchronize_all() {
  std::vector<std::shared_ptr<Queue>> qs;
  {
    std::lock_guard<std::mutex> lk(mu_);
    std::erase_if(live_, [](const std::shared_ptr<Queue>& q) { return q.use_count() == 1; });
    qs = live_;
  }
  for (auto& q : qs) q->drain();
}

std::unique_ptr<Buffer> ThreadedStreamsBackend::drained_on_free(std::unique_ptr<Buffer> b) {
  return std::make_unique<DrainedBuffer>([this] { synchronize_all(); }, std::move(b));
}

std::unique_ptr<Buffer> ThreadedStreamsBackend::alloc(size_t bytes, const std::string& what) {
  return drained_on_free(in_.alloc(bytes, what));
}
std::unique_ptr<Buffer> ThreadedStreamsBackend::alloc_host(size_t bytes, const std::string& what) {
  return drained_on_free(in_.alloc_host(bytes, what));
}
std::unique_ptr<Buffer> ThreadedStreamsBackend::map_host(void* p, size_t bytes,
                                                         const std::string& what) {
  return drained_on_free(in_.map_host(p, bytes, what));
}

// ---- copies: enqueued like every op -------------------------------------------------------

void ThreadedStreamsBackend::copy_to_device(Stream& s, void* d, const void* src, size_t n) {
  run_op(s, "copy_to_device", [=](Backend& b, Stream& is) { b.copy_to_device(is, d, src, n); });
}
void ThreadedStreamsBackend::copy_to_host(Stream& s, void* d, const void* src, size_t n) {
  run_op(s, "copy_to_host", [=](Backend& b, Stream& is) { b.copy_to_host(is, d, src, n); });
}
void ThreadedStreamsBackend::copy_on_device(Stream& s, void* d, const void* src, size_t n) {
  run_op(s, "copy_on_device", [=](Backend& b, Stream& is) { b.copy_on_device(is, d, src, n); });
}

}  // namespace sf
