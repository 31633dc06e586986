// What the trainer reads, behind a small interface so that other formats plug in:
//  - TrainStream: an endless stream of training micro-batches whose position (and any
//    shuffle RNG) is a JSON resume state;
//  - DataSource: the stream, a fixed held-out evaluation set, and an identity (files, sizes,
//    a content fingerprint, the split) that a checkpoint records so that resuming on other
//    data is refused.
// Implementations behind open_data_source(), chosen per file by data/data_file_kind.h:
//  - a TokenFile (llm.c .bin or raw uint32; data/token_file_source.h) whose tail is held out
//    and whose head is cut into rows of seq_len + 1 tokens with stride seq_len: in order
//    (TokenBatcher, llm.c style) or, with shuffle, in a seeded permutation drawn afresh every
//    epoch;
//  - a dataset (.jsonl / .json records of any data/sample_set.h format, .txt plain text;
//    data/sample_source.h): samples tokenized with the tokenizer in tokenizer_dir, loss masks as
//    data/sample_set.h computes them, packed into rows that keep samples whole;
//  - several files (data/mixed_source.h): each opened as above with its own held-out split, rows
//    drawn from them in proportion to their weights.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/batch.h"

namespace sf {

class TrainStream {
 public:
  virtual ~TrainStream() = default;
  // The next micro-batch: n_rows rows (sequences) of the request's seq_len tokens.
  virtual Batch next(int n_rows) = 0;
  virtual int64_t epoch() const = 0;            // completed passes over the training data
  virtual double epoch_fraction() const = 0;    // progress through the current pass, [0, 1)
  virtual nlohmann::json state() const = 0;     // everything next() depends on
  // Restores state(); throws Error(input) when it does not fit this data.
  virtual void restore(const nlohmann::json& state) = 0;
  // Rows next() serves before the current pass ends (a mix: the rows all its files have left).
  virtual int64_t rows_left_in_epoch() const = 0;
};

// One --data file and its mixing weight (0: none given).
struct DataInput {
  std::filesystem::path path;
  double weight = 0;
};

struct DataRequest {
  // The training data: one file, or several FILE[:WEIGHT] joined by '\n' (the repeated --data
  // flag; parse_data_inputs splits it).
  std::filesystem::path path;
  int seq_len = 256;
  double eval_fraction = 0.05;  // share of the data held out for evaluation
  int eval_batches = 4;         // held-out batches evaluated at each evaluation
  int eval_rows = 8;            // rows per held-out batch
  int64_t vocab_size = 0;       // ids must be below this
  bool shuffle = false;         // rows in a seeded random order, reshuffled every epoch
  uint64_t seed = 0;            // for sources that shuffle

  // JSONL datasets only (a token file ignores these, except that it refuses an eval_file).
  std::filesystem::path tokenizer_dir;  // the model's tokenizer.json (+ tokenizer_config.json)
  std::string format = "auto";     // auto (data/data_file_kind.h, then the first record's
                                   // fields) or a data_format_names() entry
  std::string chat_format = "auto";  // auto: the tokenizer's chat_template; or a named format
  std::string chat_date;           // Llama 3.2+ "Today Date"; empty: today (recorded in identity)
  std::string overflow = "auto";   // a sample longer than seq_len: truncate | split | drop;
                                   // auto: split for text, truncate for prompt/completion & chat
  bool skip_bad_lines = false;     // skip (and count) bad JSONL lines instead of failing
  std::filesystem::path eval_file;  // a separate evaluation file instead of eval_fraction
};

// The data formats and overflow modes DataRequest accepts (for flag validation and help).
const std::vector<std::string>& data_format_names();
const std::vector<std::string>& overflow_names();

struct DataSource {
  std::unique_ptr<TrainStream> train;
  std::vector<Batch> eval;   // the same batches at every evaluation; empty: no eval data
  nlohmann::json identity;   // compared on resume (see data_identity_mismatch)
  std::string description;   // one line for the log
  int64_t train_tokens = 0, eval_tokens = 0;
};

// The files of a --data value: "FILE" or "FILE:WEIGHT" (WEIGHT a positive number; a file whose
// own name ends so is taken whole), several joined by '\n'. Either every file has a weight or
// none has (then each weighs its share of the training tokens, as if concatenated). Error(input)
// naming the value on a bad weight, a mix of weighted and unweighted files, or a weight on a
// single file.
std::vector<DataInput> parse_data_inputs(const std::string& spec);
// The --data values joined as DataRequest::path holds them.
std::string join_data_values(const std::vector<std::string>& values);

// Opens r.path (one file: a token file or a dataset, as classify_data_file says; several: a
// mix) and splits it (or reads r.eval_file). Throws Error(input) naming the file.
DataSource open_data_source(const DataRequest& r);

// Empty when `now` is the data a checkpoint (`saved`) was trained on; else a sentence saying
// what differs. Paths may differ (data moved); sizes, fingerprint and split may not; a mix
// compares its weights and every file's identity.
std::string data_identity_mismatch(const nlohmann::json& saved, const nlohmann::json& now);

}  // namespace sf
