#include "data/data_loader.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "core/error.h"

namespace sf {

namespace {

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
uint64_t hash_step(uint64_t h, uint64_t v) { return mix64(h ^ mix64(v)); }

// splitmix64 stream; uniform integers by rejection (no modulo bias), same on every platform.
struct Rng {
  uint64_t s;
  uint64_t next() { return mix64(s += 0x9e3779b97f4a7c15ull); }
  uint64_t below(uint64_t n) {
    const uint64_t limit = ~uint64_t(0) - (~uint64_t(0) % n);
    for (;;) {
      const uint64_t x = next();
      if (x < limit) return x % n;
    }
  }
};

constexpr size_t kOpenRows = 16;

}  // namespace

DataLoader::DataLoader(std::shared_ptr<const SampleSet> samples, std::vector<int64_t> indices,
                       const LoaderOptions& opt)
    : samples_(std::move(samples)), opt_(opt) {
  SF_REQUIRE(opt.seq_len > 0, "--seq-len must be positive");
  SF_REQUIRE(opt.overflow == "truncate" || opt.overflow == "split" || opt.overflow == "drop",
             "--overflow ", opt.overflow, " is not known; use truncate, split or drop");
  const int64_t L = opt.seq_len;
  for (int64_t i : indices) {
    const int64_t len = samples_->length(i);
    auto add = [&](int64_t b, int64_t n) {
      if (samples_->valid_labels(i, b, n) == 0) {
        ++stats_.dropped_no_loss;
        return;
      }
      items_.push_back({i, b, n});
      stats_.tokens += n;
    };
    if (len <= L) {
      add(0, len);
    } else if (opt.overflow == "truncate") {
      ++stats_.truncated;
      add(0, L);
    } else if (opt.overflow == "split") {
      ++stats_.split;
      for (int64_t b = 0; b < len; b += L) add(b, std::min(L, len - b));
    } else {
      ++stats_.dropped_long;
    }
  }
  stats_.items = int64_t(items_.size());
  SF_REQUIRE(!items_.empty(), "no sample left to train on after packing into --seq-len ", L,
             " (", stats_.dropped_long, " too long, ", stats_.dropped_no_loss,
             " without loss tokens)");
  uint64_t h = hash_step(samples_->fingerprint(), uint64_t(L));
  h = hash_step(h, opt.overflow == "truncate" ? 1 : opt.overflow == "split" ? 2 : 3);
  h = hash_step(h, opt.seed);
  h = hash_step(h, uint64_t(opt.shuffle) | uint64_t(opt.pad_rows) << 1);
  for (int64_t i : indices) h = hash_step(h, uint64_t(i));
  fingerprint_ = h;
}

void DataLoader::plan_epoch() const {
  if (planned_epoch_ == epoch_) return;
  std::vector<int32_t> order(items_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
  if (opt_.shuffle) {
    Rng rng{mix64(opt_.seed ^ mix64(uint64_t(epoch_) + 0x5eed))};
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
  }
  struct Open {
    int64_t used = 0;
    std::vector<int32_t> items;
  };
  std::vector<Open> open;
  row_start_.assign(1, 0);
  row_items_.clear();
  auto emit = [&](size_t k) {
    row_items_.insert(row_items_.end(), open[k].items.begin(), open[k].items.end());
    row_start_.push_back(int64_t(row_items_.size()));
    open.erase(open.begin() + std::ptrdiff_t(k));
  };
  for (int32_t it : order) {
    const int64_t len = items_[size_t(it)].len;
    size_t k = 0;
    while (k < open.size() && open[k].used + len > opt_.seq_len) ++k;
    if (k == open.size()) {
      if (open.size() == kOpenRows) {
        size_t full = 0;
        for (size_t q = 1; q < open.size(); ++q)
          if (open[q].used > open[full].used) full = q;
        emit(full);
      }
      open.emplace_back();
      k = open.size() - 1;
    }
    open[k].used += len;
    open[k].items.push_back(it);
    if (open[k].used == opt_.seq_len) emit(k);
  }
  while (!open.empty()) emit(0);
  planned_epoch_ = epoch_;
}

int64_t DataLoader::rows_in_epoch() const {
  plan_epoch();
  return int64_t(row_start_.size()) - 1;
}

int64_t DataLoader::rows_left_in_epoch() const { return rows_in_epoch() - row_; }

double DataLoader::epoch_fraction() const {
  return double(row_) / double(std::max<int64_t>(1, rows_in_epoch()));
}

nlohmann::json DataLoader::state() const {
  char fp[20];
  std::snprintf(fp, sizeof fp, "%016llx", static_cast<unsigned long long>(fingerprint_));
  return {{"epoch", epoch_}, {"row", row_}, {"fingerprint", fp}};
}

void DataLoader::restore(const nlohmann::json& s) {
  SF_REQUIRE(s.is_object() && s.contains("epoch") && s.contains("row") &&
                 s.contains("fingerprint") && s["epoch"].is_number_integer() &&
                 s["row"].is_number_integer() && s["fingerprint"].is_string(),
             "the resume state's data position ", s.dump(),
             " is not {\"epoch\", \"row\", \"fingerprint\"} (made by another data source?)");
  DataPosition p;
  p.epoch = s["epoch"].get<int64_t>();
  p.row = s["row"].get<int64_t>();
  p.fingerprint = std::stoull(s["fingerprint"].get<std::string>(), nullptr, 16);
  seek(p);
}

Batch DataLoader::next(int n_rows) {
  SF_REQUIRE(n_rows > 0, "batch of ", n_rows, " rows");
  Batch b;
  b.cu_seqlens.push_back(0);
  for (int r = 0; r < n_rows; ++r) {
    if (row_ >= rows_in_epoch()) {
      ++epoch_;
      row_ = 0;
      plan_epoch();
    }
    int64_t used = 0;
    for (int64_t q = row_start_[size_t(row_)]; q < row_start_[size_t(row_) + 1]; ++q) {
      const Item& it = items_[size_t(row_items_[size_t(q)])];
      const size_t o = b.tokens.size();
      b.tokens.resize(o + size_t(it.len));
      b.labels.resize(o + size_t(it.len));
      samples_->read(it.sample, it.begin, it.len, b.tokens.data() + o, b.labels.data() + o);
      for (int64_t t = 0; t < it.len; ++t) b.positions.push_back(int32_t(t));
      b.cu_seqlens.push_back(int32_t(b.tokens.size()));
      used += it.len;
    }
    if (opt_.pad_rows && used < opt_.seq_len) {
      for (int64_t t = 0; t < opt_.seq_len - used; ++t) {
        b.tokens.push_back(opt_.pad_id);
        b.labels.push_back(kIgnoreLabel);
        b.positions.push_back(int32_t(t));
      }
      b.cu_seqlens.push_back(int32_t(b.tokens.size()));
    }
    ++row_;
  }
  return b;
}

void DataLoader::seek(const DataPosition& p) {
  SF_REQUIRE(p.fingerprint == fingerprint_,
             "the resume state's data position belongs to other data or data settings (dataset "
             "content, eval split, --seq-len, --overflow, --seed or shuffling differ); resume with "
             "the same ones");
  SF_REQUIRE(p.epoch >= 0 && p.row >= 0, "bad data position");
  epoch_ = p.epoch;
  row_ = p.row;
  SF_REQUIRE(row_ <= rows_in_epoch(), "data position row ", p.row, " is past the ",
             rows_in_epoch(), " rows of epoch ", p.epoch);
}

std::string DataLoader::summary() const {
  std::ostringstream os;
  const int64_t rows = rows_in_epoch();
  os << stats_.items << " sequences in " << rows << " rows of up to " << opt_.seq_len
     << " tokens per epoch (" << (rows ? 100.0 * double(stats_.tokens) / double(rows * opt_.seq_len) : 0.0)
     << "% filled)";
  if (stats_.truncated) os << "; " << stats_.truncated << " samples longer than --seq-len truncated";
  if (stats_.split) os << "; " << stats_.split << " samples longer than --seq-len split";
  if (stats_.dropped_long) os << "; " << stats_.dropped_long << " samples longer than --seq-len dropped";
  if (stats_.dropped_no_loss) os << "; " << stats_.dropped_no_loss << " pieces without loss tokens dropped";
  return os.str();
}

// ---- TrainingData ---------------------------------------------------------------------------

DataLoader TrainingData::train_loader() const {
  return DataLoader(train_samples, train_indices, loader);
}

DataLoader TrainingData::eval_loader() const {
  SF_CHECK(has_eval(), "eval_loader without evaluation data");
  LoaderOptions o = loader;
  o.shuffle = false;
  return DataLoader(eval_samples, eval_indices, o);
}

std::vector<Batch> TrainingData::eval_batches(int rows, int max_batches) const {
  std::vector<Batch> out;
  if (!has_eval() || rows <= 0) return out;
  DataLoader ev = eval_loader();
  while (int(out.size()) < max_batches && ev.rows_left_in_epoch() > 0)
    out.push_back(ev.next(int(std::min<int64_t>(rows, ev.rows_left_in_epoch()))));
  return out;
}

int64_t TrainingData::train_tokens() const { return train_loader().stats().tokens; }

int64_t TrainingData::eval_tokens() const { return has_eval() ? eval_loader().stats().tokens : 0; }

nlohmann::json TrainingData::identity() const {
  auto fp = [](uint64_t v) {
    char b[20];
    std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(v));
    return std::string(b);
  };
  auto file = [&](const DataReport& r, const SampleSet& s) {
    return nlohmann::json{{"format", data_format_name(r.format)}, {"chat_format", r.chat_format},
                          {"samples", s.size()}, {"tokens", r.tokens},
                          {"loss_tokens", r.loss_tokens}, {"fingerprint", fp(s.fingerprint())}};
  };
  nlohmann::json j = {{"kind", "dataset"},
                      {"path", train_report.path.string()},
                      {"train", file(train_report, *train_samples)},
                      {"train_samples", train_indices.size()},
                      {"eval_samples", eval_indices.size()},
                      {"seq_len", loader.seq_len},
                      {"overflow", loader.overflow}};
  if (!eval_report.path.empty()) j["eval"] = file(eval_report, *eval_samples);
  return j;
}

uint32_t TrainingData::max_token_id() const {
  uint32_t m = train_samples->max_token_id();
  if (eval_samples && eval_samples != train_samples) m = std::max(m, eval_samples->max_token_id());
  return m;
}

std::string TrainingData::summary() const {
  std::ostringstream os;
  os << "train data: " << train_report.summary() << "\n";
  for (const auto& e : train_report.bad_examples) os << "  skipped " << e << "\n";
  if (!eval_report.path.empty()) {
    os << "eval data: " << eval_report.summary() << "\n";
    for (const auto& e : eval_report.bad_examples) os << "  skipped " << e << "\n";
  } else if (has_eval()) {
    os << "eval data: " << eval_indices.size() << " of the " << train_samples->size()
       << " samples held out\n";
  }
  return os.str();
}

TrainingData open_training_data(const std::filesystem::path& train_file, const Tokenizer* tok,
                                const DatasetOptions& opt, uint64_t seed, bool shuffle,
                                bool pad_rows) {
  TrainingData d;
  LoadedData tr = load_dataset(train_file, tok, opt);
  d.train_samples = tr.samples;
  d.train_report = std::move(tr.report);
  if (!opt.eval_file.empty()) {
    LoadedData ev = load_dataset(opt.eval_file, tok, opt);
    d.eval_samples = ev.samples;
    d.eval_report = std::move(ev.report);
    d.train_indices.resize(size_t(d.train_samples->size()));
    for (int64_t i = 0; i < d.train_samples->size(); ++i) d.train_indices[size_t(i)] = i;
    d.eval_indices.resize(size_t(d.eval_samples->size()));
    for (int64_t i = 0; i < d.eval_samples->size(); ++i) d.eval_indices[size_t(i)] = i;
  } else {
    DataSplit sp = split_dataset(*d.train_samples, opt.eval_fraction);
    d.eval_samples = d.train_samples;
    d.train_indices = std::move(sp.train);
    d.eval_indices = std::move(sp.eval);
  }
  d.loader.seq_len = opt.seq_len;
  d.loader.overflow = opt.overflow;
  d.loader.seed = seed;
  d.loader.shuffle = shuffle;
  d.loader.pad_rows = pad_rows;
  if (tok) d.loader.pad_id = tok->pad_id() ? *tok->pad_id() : tok->eos_id() ? *tok->eos_id() : 0;
  return d;
}

}  // namespace sf
