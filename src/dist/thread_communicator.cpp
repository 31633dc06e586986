// Ranks as threads: a two-phase rendezvous per collective (contract in thread_communicator.h).
// arrive(): every rank publishes its buffers and waits for all; each rank then computes ITS
// output alone from everyone's inputs, in rank order; depart(): waits until all are done
// reading, so no rank overwrites an input another still reads (all_reduce is in place: the sum
// goes to a private copy first and into the caller's buffer only after depart).
#include "dist/thread_communicator.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace sf::dist {

namespace {

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) {
    if (!s.empty()) s += ", ";
    s += std::to_string(r);
  }
  return s;
}

template <class T>
bool overlaps(std::span<const T> a, std::span<const T> b) {
  return !a.empty() && !b.empty() && a.data() < b.data() + b.size() && b.data() < a.data() + a.size();
}

}  // namespace

ThreadGroup::ThreadGroup(int world_size, Timeout timeout)
    : world_(world_size), timeout_(timeout) {
  SF_REQUIRE(world_size >= 1, "ThreadGroup: world size ", world_size, " must be at least 1");
  SF_REQUIRE(timeout.count() > 0, "ThreadGroup: timeout ", timeout.count(),
             " ms must be positive (a collective must never wait forever)");
  posts_.resize(static_cast<size_t>(world_));
  phase_.assign(static_cast<size_t>(world_), 0);
}

void ThreadGroup::fail(const std::string& why) {
  if (failure_.empty()) failure_ = why;
  changed_.notify_all();
}

void ThreadGroup::abort(const std::string& why) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    fail(why);
  } catch (...) {  // a failed lock or allocation: the timeout still stops the others
  }
}

void ThreadGroup::wait_all(std::unique_lock<std::mutex>& lock, int rank, uint64_t phase,
                           const char* op) {
  auto all_here = [&] {
    return std::all_of(phase_.begin(), phase_.end(), [&](uint64_t p) { return p >= phase; });
  };
  const bool done = changed_.wait_for(lock, timeout_, [&] { return !failure_.empty() || all_here(); });
  if (failure_.empty() && !done) {
    std::vector<int> missing;
    for (int r = 0; r < world_; ++r)
      if (phase_[static_cast<size_t>(r)] < phase) missing.push_back(r);
    fail(cat("rank ", rank_list(missing), " did not arrive at ", op, " within ", timeout_.count(),
             " ms (rank ", rank, " of ", world_, " waited): that rank crashed, hangs or makes "
             "different calls; see its own error, or raise the timeout if it is only slow"));
  }
  if (!failure_.empty()) throw Error(ErrorKind::io, failure_);
}

const std::vector<ThreadGroup::Post>& ThreadGroup::arrive(int rank, const Post& post) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!failure_.empty())
    throw Error(ErrorKind::io, cat("rank ", rank, ": ", post.op, " on a broken group: ", failure_));
  posts_[static_cast<size_t>(rank)] = post;
  const uint64_t phase = ++phase_[static_cast<size_t>(rank)];
  changed_.notify_all();
  wait_all(lock, rank, phase, post.op);
  const Post& p0 = posts_[0];
  for (int r = 1; r < world_; ++r) {
    const Post& p = posts_[static_cast<size_t>(r)];
    if (std::strcmp(p.op, p0.op) != 0 || p.count != p0.count || p.root != p0.root) {
      fail(cat("ranks disagree on a collective: rank 0 called ", p0.op, " with ", p0.count,
               " elements (root ", p0.root, "), rank ", r, " called ", p.op, " with ", p.count,
               " elements (root ", p.root, "): every rank must make the same calls in the same order"));
      throw Error(ErrorKind::io, failure_);
    }
  }
  return posts_;
}

void ThreadGroup::depart(int rank, const char* op) {
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t phase = ++phase_[static_cast<size_t>(rank)];
  changed_.notify_all();
  wait_all(lock, rank, phase, op);
}

ThreadCommunicator::ThreadCommunicator(std::shared_ptr<ThreadGroup> group, int rank)
    : Communicator(group ? group->timeout() : Timeout(1)), group_(std::move(group)), rank_(rank) {
  SF_CHECK(group_ != nullptr, "ThreadCommunicator: no group");
  SF_REQUIRE(rank >= 0 && rank < group_->world_size(), "ThreadCommunicator: rank ", rank,
             " outside the group's world of ", group_->world_size());
}

void ThreadCommunicator::abort(const std::string& why) noexcept {
  try {
    group_->abort(cat("rank ", rank_, " aborted the group: ", why));
  } catch (...) {  // building the message failed: abort with what we have
    group_->abort("a rank aborted the group");
  }
}

void ThreadCommunicator::refuse(const std::string& why) {
  abort(why);
  throw Error(ErrorKind::internal, cat("rank ", rank_, ": ", why));
}

template <class T>
void ThreadCommunicator::all_reduce(std::span<T> data, const char* op) {
  const auto& posts = group_->arrive(rank_, {op, data.data(), data.data(), data.size(), data.size(), -1});
  const T* x0 = static_cast<const T*>(posts[0].send);
  std::vector<T> sum(x0, x0 + data.size());
  for (size_t r = 1; r < posts.size(); ++r) {
    const T* x = static_cast<const T*>(posts[r].send);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += x[i];
  }
  group_->depart(rank_, op);
  std::copy(sum.begin(), sum.end(), data.begin());
}

void ThreadCommunicator::all_reduce_sum(std::span<float> data) { all_reduce(data, "all_reduce_sum(f32)"); }
void ThreadCommunicator::all_reduce_sum(std::span<double> data) { all_reduce(data, "all_reduce_sum(f64)"); }

void ThreadCommunicator::reduce_scatter_sum(std::span<const float> send, std::span<float> recv) {
  const char* op = "reduce_scatter_sum(f32)";
  const ShardRange mine = shard_range(send.size(), world_size(), rank_);
  if (recv.size() != mine.size())
    refuse(cat(op, ": recv holds ", recv.size(), " elements, this rank's shard of ", send.size(),
               " is ", mine.size(), " (dist::shard_range)"));
  if (overlaps(send, std::span<const float>(recv)))
    refuse(cat(op, ": recv overlaps send (not an in-place call)"));
  const auto& posts = group_->arrive(rank_, {op, send.data(), recv.data(), send.size(), recv.size(), -1});
  for (size_t j = 0; j < recv.size(); ++j) {
    float acc = static_cast<const float*>(posts[0].send)[mine.begin + j];
    for (size_t r = 1; r < posts.size(); ++r) acc += static_cast<const float*>(posts[r].send)[mine.begin + j];
    recv[j] = acc;
  }
  group_->depart(rank_, op);
}

void ThreadCommunicator::all_gather(std::span<const float> mine, std::span<float> out) {
  const char* op = "all_gather(f32)";
  const ShardRange own = shard_range(out.size(), world_size(), rank_);
  if (mine.size() != own.size())
    refuse(cat(op, ": this rank brings ", mine.size(), " elements, its shard of ", out.size(),
               " is ", own.size(), " (dist::shard_range)"));
  if (overlaps(mine, std::span<const float>(out)))
    refuse(cat(op, ": mine overlaps out (not an in-place call)"));
  const auto& posts = group_->arrive(rank_, {op, mine.data(), out.data(), out.size(), mine.size(), -1});
  for (int r = 0; r < world_size(); ++r) {
    const ShardRange s = shard_range(out.size(), world_size(), r);
    const float* x = static_cast<const float*>(posts[static_cast<size_t>(r)].send);
    std::copy(x, x + s.size(), out.begin() + static_cast<std::ptrdiff_t>(s.begin));
  }
  group_->depart(rank_, op);
}

void ThreadCommunicator::broadcast(std::span<std::byte> data, int root) {
  const char* op = "broadcast";
  if (root < 0 || root >= world_size())
    refuse(cat(op, ": root ", root, " outside the world of ", world_size()));
  const auto& posts = group_->arrive(rank_, {op, data.data(), data.data(), data.size(), data.size(), root});
  if (rank_ != root && !data.empty())
    std::memcpy(data.data(), posts[static_cast<size_t>(root)].send, data.size());
  group_->depart(rank_, op);
}

void ThreadCommunicator::barrier() {
  group_->arrive(rank_, {"barrier", nullptr, nullptr, 0, 0, -1});
  group_->depart(rank_, "barrier");
}

}  // namespace sf::dist
