// The trainer's DataSource (data/data_source.h) for datasets held as a SampleSet: the record
// formats of data/sample_set.h (and token files, shuffled by window) through
// data/sample_set.h and data/data_loader.h. Owns nothing beyond the DataSource it returns.
#pragma once
#include <filesystem>
#include <string>

#include "data/data_loader.h"
#include "data/data_source.h"
#include "text/tokenizer.h"

namespace sf {

// What DataRequest does not carry. data.seq_len and data.eval_fraction are taken from the
// request; the rest (format, chat_format, chat_date, overflow, skip_bad_lines, eval_file,
// tokenizer_dir) from here.
struct DatasetSourceOptions {
  DatasetOptions data;
  bool shuffle = true;
  bool pad_rows = false;
};

// True when `path` is read by open_dataset_source by its name: a .jsonl / .json / .txt file, or
// any file when `format` names a dataset format (data/data_file_kind.h decides for the rest).
bool is_dataset_file(const std::filesystem::path& path, const std::string& format = "auto");

// Loads r.path (tok: the model's tokenizer; null only for token files), splits or reads
// data.eval_file, and returns the stream (DataLoader; state() = {"epoch","row","fingerprint"}),
// the fixed eval batches (r.eval_batches x r.eval_rows rows), an identity that names the chat
// date when one was rendered, and a description. Error(input) naming the file on bad data or
// on a token id outside r.vocab_size.
DataSource open_dataset_source(const DataRequest& r, const Tokenizer* tok,
                               const DatasetSourceOptions& o);

// open_data_source() for a JSONL dataset: loads the tokenizer of r.tokenizer_dir (Error(input)
// when there is none), resolves overflow "auto" (split for text, truncate for prompt/completion
// and chat) and calls open_dataset_source with the request's options (no row padding).
DataSource open_jsonl_source(const DataRequest& r);

}  // namespace sf
