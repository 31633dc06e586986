// The trainer's DataSource (train/data_source.h) for datasets: JSONL text, prompt/completion and
// chat files (and token files, shuffled by window) through train/dataset.h and
// train/dataset_loader.h. Owns nothing beyond the DataSource it returns.
#pragma once
#include <filesystem>
#include <string>

#include "text/tokenizer.h"
#include "train/data_source.h"
#include "train/dataset_loader.h"

namespace sf {

// What DataRequest does not carry. data.seq_len and data.eval_fraction are taken from the
// request; the rest (format, chat_format, chat_date, overflow, skip_bad_lines, eval_file,
// tokenizer_dir) from here.
struct DatasetSourceOptions {
  DatasetOptions data;
  bool shuffle = true;
  bool pad_rows = false;
};

// True when `path` is read by open_dataset_source: a .jsonl / .json file, or any file when
// `format` names a JSONL format (text, prompt_completion, messages).
bool is_dataset_file(const std::filesystem::path& path, const std::string& format = "auto");

// Loads r.path (tok: the model's tokenizer; null only for token files), splits or reads
// data.eval_file, and returns the stream (DataLoader; state() = {"epoch","row","fingerprint"}),
// the fixed eval batches (r.eval_batches x r.eval_rows rows), an identity that names the chat
// date when one was rendered, and a description. Error(input) naming the file on bad data or
// on a token id outside r.vocab_size.
DataSource open_dataset_source(const DataRequest& r, const Tokenizer* tok,
                               const DatasetSourceOptions& o);

}  // namespace sf
