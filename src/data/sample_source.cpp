#include "data/sample_source.h"

#include <algorithm>

#include "core/error.h"

namespace sf {

namespace fs = std::filesystem;

namespace {

class DatasetStream final : public TrainStream {
 public:
  explicit DatasetStream(DataLoader dl) : dl_(std::move(dl)) {}
  Batch next(int n_rows) override { return dl_.next(n_rows); }
  int64_t epoch() const override { return dl_.epoch(); }
  double epoch_fraction() const override { return std::min(dl_.epoch_fraction(), 0.999999); }
  nlohmann::json state() const override { return dl_.state(); }
  void restore(const nlohmann::json& s) override { dl_.restore(s); }
  int64_t rows_left_in_epoch() const override { return dl_.rows_left_in_epoch(); }

 private:
  DataLoader dl_;
};

// "auto": plain text is usually long documents, which split keeps whole across rows; a prompt
// or conversation cut into pieces would lose its context, so those are truncated.
std::string resolve_overflow(const DataRequest& r) {
  if (r.overflow != "auto") return r.overflow;
  const DataFormat f = detect_data_format(r.path, r.format, r.skip_bad_lines);
  return f == DataFormat::text || f == DataFormat::plain_text ? "split" : "truncate";
}

}  // namespace

bool is_dataset_file(const std::filesystem::path& path, const std::string& format) {
  if (format != "auto" && format != "tokens") return true;
  const std::string ext = path.extension().string();
  return format == "auto" && (ext == ".jsonl" || ext == ".json" || ext == ".txt");
}

DataSource open_dataset_source(const DataRequest& r, const Tokenizer* tok,
                               const DatasetSourceOptions& o) {
  DatasetOptions d = o.data;
  d.seq_len = r.seq_len;
  d.eval_fraction = r.eval_fraction;
  TrainingData td = open_training_data(r.path, tok, d, r.seed, o.shuffle, o.pad_rows);
  SF_REQUIRE(r.vocab_size <= 0 || int64_t(td.max_token_id()) < r.vocab_size, r.path.string(),
             ": holds token id ", td.max_token_id(), " but the model's vocab_size is ",
             r.vocab_size, "; the data was tokenized for another model");
  DataSource ds;
  DataLoader train = td.train_loader();
  ds.description = td.train_report.summary() + "; " + train.summary();
  if (!td.eval_report.path.empty()) ds.description += "; eval: " + td.eval_report.summary();
  else if (td.has_eval()) ds.description += "; " + std::to_string(td.eval_indices.size()) + " samples held out";
  ds.train_tokens = train.stats().tokens;
  ds.eval_tokens = td.eval_tokens();
  ds.eval = td.eval_batches(r.eval_rows, r.eval_batches);
  ds.identity = td.identity();
  if (!td.train_report.chat_date.empty()) ds.identity["chat_date"] = td.train_report.chat_date;
  ds.train = std::make_unique<DatasetStream>(std::move(train));
  return ds;
}

DataSource open_jsonl_source(const DataRequest& r) {
  SF_REQUIRE(!r.tokenizer_dir.empty(), r.path.string(),
             ": a JSONL dataset is tokenized with the model's tokenizer, but no tokenizer "
             "directory was given (--model DIR holding tokenizer.json)");
  SF_REQUIRE(fs::exists(r.tokenizer_dir / "tokenizer.json") ||
                 fs::is_regular_file(r.tokenizer_dir),
             r.tokenizer_dir.string(), ": no tokenizer.json here; the JSONL dataset ",
             r.path.string(), " needs the model's tokenizer (or pass a token file to --data)");
  const Tokenizer tok = Tokenizer::load(r.tokenizer_dir);
  DatasetSourceOptions o;
  o.data.format = r.format;
  o.data.chat_format = r.chat_format;
  o.data.chat_date = r.chat_date;
  o.data.overflow = resolve_overflow(r);
  o.data.skip_bad_lines = r.skip_bad_lines;
  o.data.eval_file = r.eval_file;
  o.data.tokenizer_dir = r.tokenizer_dir;
  o.shuffle = r.shuffle;
  o.pad_rows = false;  // the executors take rows of any length up to seq_len
  return open_dataset_source(r, &tok, o);
}

}  // namespace sf
