#include "train/dataset_source.h"

#include <algorithm>

#include "core/error.h"

namespace sf {

namespace {

class DatasetStream final : public TrainStream {
 public:
  explicit DatasetStream(DataLoader dl) : dl_(std::move(dl)) {}
  Batch next(int n_rows) override { return dl_.next(n_rows); }
  int64_t epoch() const override { return dl_.epoch(); }
  double epoch_fraction() const override { return std::min(dl_.epoch_fraction(), 0.999999); }
  nlohmann::json state() const override { return dl_.state(); }
  void restore(const nlohmann::json& s) override { dl_.restore(s); }

 private:
  DataLoader dl_;
};

}  // namespace

bool is_dataset_file(const std::filesystem::path& path, const std::string& format) {
  if (format == "text" || format == "prompt_completion" || format == "prompt-completion" ||
      format == "messages" || format == "chat")
    return true;
  const std::string ext = path.extension().string();
  return format == "auto" && (ext == ".jsonl" || ext == ".json");
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

}  // namespace sf
