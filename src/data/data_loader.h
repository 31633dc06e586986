// Batches from a SampleSet: packing into rows of at most seq_len tokens that keep samples whole
// (one sequence per sample in cu_seqlens, positions restarting, so attention never crosses a
// sample), shuffling per epoch, epochs, and a position for exact resume.
//
// Per epoch: the items (samples, or pieces of over-long ones) are put in an order (identity, or
// a Fisher-Yates shuffle from a splitmix64 stream seeded by (seed, epoch): the same on every
// platform), then packed first-fit into at most 16 open rows (a row is closed when full; when a
// 17th would be needed, the fullest open one is closed). The plan is a pure function of (data,
// split, options, epoch), so DataPosition {epoch, row} restores the exact batch sequence.
//
// Over-long samples (longer than seq_len): truncate (keep the first seq_len tokens), split
// (consecutive pieces of seq_len, each its own sequence) or drop; counted in stats(). Pieces with
// no label that counts are dropped.
//
// Rows are not padded unless LoaderOptions::pad_rows (a padding sequence of pad_id tokens with no
// labels fills each row to seq_len): the executors accept any token count up to their capacity.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/sample_set.h"
#include "model/batch.h"

namespace sf {

struct DataPosition {
  int64_t epoch = 0;         // epochs completed
  int64_t row = 0;           // next row of the epoch's packing plan
  uint64_t fingerprint = 0;  // data + split + loader options; seek() refuses another
};

struct LoaderOptions {
  int seq_len = 0;
  std::string overflow = "truncate";  // truncate | split | drop
  uint64_t seed = 0;
  bool shuffle = true;
  bool pad_rows = false;
  int32_t pad_id = 0;
};

struct PackStats {
  int64_t items = 0;            // sequences per epoch (samples and pieces)
  int64_t truncated = 0;        // samples cut to seq_len
  int64_t split = 0;            // samples split into pieces
  int64_t dropped_long = 0;     // samples dropped for their length (overflow = drop)
  int64_t dropped_no_loss = 0;  // pieces without a label that counts
  int64_t tokens = 0;           // tokens per epoch
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const SampleSet> samples, std::vector<int64_t> indices,
             const LoaderOptions& opt);

  // The next n_rows rows (continuing into the next epoch, reshuffled, at the end of one).
  Batch next(int n_rows);
  // At the end of an epoch the position stays there ({epoch, rows_in_epoch()}); the next row
  // served starts the next epoch.
  int64_t rows_in_epoch() const;       // of the current epoch's plan
  int64_t rows_left_in_epoch() const;  // eval: next(min(rows, rows_left_in_epoch())) until 0
  int64_t epoch() const { return epoch_; }
  double epoch_fraction() const;       // rows served of the current epoch, [0, 1]

  DataPosition position() const { return {epoch_, row_, fingerprint_}; }
  void seek(const DataPosition& p);
  uint64_t fingerprint() const { return fingerprint_; }
  // The position as JSON for a resume state: {"epoch", "row", "fingerprint" (hex)}; restore()
  // takes it back (Error(input) when it is malformed or belongs to other data or settings).
  nlohmann::json state() const;
  void restore(const nlohmann::json& state);

  const PackStats& stats() const { return stats_; }
  // One line: items, rows and fill of the current epoch, truncations.
  std::string summary() const;

 private:
  struct Item {
    int64_t sample, begin, len;
  };
  void plan_epoch() const;

  std::shared_ptr<const SampleSet> samples_;
  LoaderOptions opt_;
  std::vector<Item> items_;
  PackStats stats_;
  uint64_t fingerprint_ = 0;
  int64_t epoch_ = 0, row_ = 0;
  // The current epoch's packing plan, made on first use (a cache: hence mutable).
  mutable int64_t planned_epoch_ = -1;
  mutable std::vector<int64_t> row_start_;  // into row_items_, rows + 1 entries
  mutable std::vector<int32_t> row_items_;
};

// Everything the trainer needs: the training samples and split, the evaluation set, loaders.
struct TrainingData {
  std::shared_ptr<SampleSet> train_samples, eval_samples;  // the same object when split
  std::vector<int64_t> train_indices, eval_indices;
  DataReport train_report, eval_report;  // eval_report.path is empty when split off
  LoaderOptions loader;

  DataLoader train_loader() const;  // shuffled per LoaderOptions
  DataLoader eval_loader() const;   // fixed order; check has_eval() first
  bool has_eval() const { return !eval_indices.empty(); }
  // The fixed evaluation batches: up to max_batches batches of `rows` rows from the start of
  // the eval set (fewer rows in the last one); empty without eval data.
  std::vector<Batch> eval_batches(int rows, int max_batches) const;
  uint32_t max_token_id() const;
  int64_t train_tokens() const;  // input tokens of one training epoch (after truncation)
  int64_t eval_tokens() const;
  // What a checkpoint records to refuse resuming on other data: format, sample and token
  // counts, content fingerprints, the split and the loader settings ("path" is informative).
  nlohmann::json identity() const;
  std::string summary() const;  // a few lines for the log
};

// Loads `train_file` (and opt.eval_file, or splits off opt.eval_fraction) for `tok` (null only
// for token files). pad_id: the tokenizer's pad token (else EOS, else 0) when pad_rows.
TrainingData open_training_data(const std::filesystem::path& train_file, const Tokenizer* tok,
                                const DatasetOptions& opt, uint64_t seed, bool shuffle = true,
                                bool pad_rows = false);

}  // namespace sf
