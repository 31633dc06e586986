#include "data/mixed_source.h"

#include <cmath>
#include <iomanip>
#include <sstream>

#include "core/error.h"

namespace sf {

namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void append(Batch& out, const Batch& b) {
  const int32_t base = int32_t(out.tokens.size());
  out.tokens.insert(out.tokens.end(), b.tokens.begin(), b.tokens.end());
  out.labels.insert(out.labels.end(), b.labels.begin(), b.labels.end());
  out.positions.insert(out.positions.end(), b.positions.begin(), b.positions.end());
  for (size_t i = 1; i < b.cu_seqlens.size(); ++i) out.cu_seqlens.push_back(base + b.cu_seqlens[i]);
}

class MixedStream final : public TrainStream {
 public:
  MixedStream(std::vector<std::unique_ptr<TrainStream>> s, const std::vector<double>& weights,
              uint64_t seed)
      : streams_(std::move(s)), seed_(seed) {
    double total = 0;
    for (double w : weights) total += w;
    double acc = 0;
    for (double w : weights) cumulative_.push_back(acc += w / total);
    cumulative_.back() = 1.0;
  }

  Batch next(int n_rows) override {
    Batch out;
    out.cu_seqlens.push_back(0);
    for (int r = 0; r < n_rows; ++r) append(out, streams_[pick(row_++)]->next(1));
    return out;
  }
  // The file drawn furthest sets the pace: an epoch ends when some file has been seen whole.
  int64_t epoch() const override { return int64_t(std::floor(progress())); }
  double epoch_fraction() const override { return progress() - std::floor(progress()); }
  int64_t rows_left_in_epoch() const override {
    int64_t n = 0;
    for (auto& s : streams_) n += s->rows_left_in_epoch();
    return n;
  }
  nlohmann::json state() const override {
    nlohmann::json files = nlohmann::json::array();
    for (auto& s : streams_) files.push_back(s->state());
    return {{"mix_row", row_}, {"files", files}};
  }
  void restore(const nlohmann::json& s) override {
    SF_REQUIRE(s.is_object() && s.contains("mix_row") && s.contains("files") &&
                   s.at("files").is_array() && s.at("files").size() == streams_.size(),
               "the checkpoint's data state ", s.dump(), " is not that of a mix of ",
               streams_.size(), " files; the checkpoint was made with other data");
    for (size_t i = 0; i < streams_.size(); ++i) streams_[i]->restore(s.at("files")[i]);
    row_ = s.at("mix_row").get<int64_t>();
  }

 private:
  size_t pick(int64_t row) const {
    const double u = double(splitmix(seed_ ^ splitmix(uint64_t(row))) >> 11) * 0x1.0p-53;
    size_t i = 0;
    while (i + 1 < cumulative_.size() && u >= cumulative_[i]) ++i;
    return i;
  }
  double progress() const {
    double m = 0;
    for (auto& s : streams_) m = std::max(m, double(s->epoch()) + s->epoch_fraction());
    return m;
  }

  std::vector<std::unique_ptr<TrainStream>> streams_;
  std::vector<double> cumulative_;
  uint64_t seed_;
  int64_t row_ = 0;
};

}  // namespace

DataSource mix_data_sources(std::vector<DataSource> sources, const std::vector<double>& weights,
                            uint64_t seed) {
  SF_CHECK(sources.size() >= 2 && sources.size() == weights.size(), "a mix of ", sources.size(),
           " sources with ", weights.size(), " weights");
  DataSource d;
  double total = 0;
  for (double w : weights) total += w;
  std::vector<std::unique_ptr<TrainStream>> streams;
  nlohmann::json files = nlohmann::json::array();
  std::ostringstream desc;
  desc << "mix of " << sources.size() << " files:";
  for (size_t i = 0; i < sources.size(); ++i) {
    DataSource& s = sources[i];
    desc << "\n  " << std::fixed << std::setprecision(1) << 100.0 * weights[i] / total
         << "% of rows: " << s.description;
    d.train_tokens += s.train_tokens;
    d.eval_tokens += s.eval_tokens;
    for (Batch& b : s.eval) d.eval.push_back(std::move(b));
    files.push_back(s.identity);
    streams.push_back(std::move(s.train));
  }
  d.identity = {{"kind", "mix"}, {"weights", weights}, {"files", files}};
  d.description = desc.str();
  d.train = std::make_unique<MixedStream>(std::move(streams), weights, seed);
  return d;
}

}  // namespace sf
