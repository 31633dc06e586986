// Training data from files: dataset records tokenized into samples, or a pre-tokenized token
// stream, held as a SampleSet; a deterministic train/eval split. Packing, shuffling, epochs and
// the resume position are DataLoader's (data/data_loader.h).
//
// Files (data/dataset_records.h): JSON Lines (.jsonl), a JSON array of records (.json; a .json
// file of JSON Lines also reads), plain text (.txt: documents separated by blank lines), or a
// token file (data/token_file.h). The format is detected from the first record's fields
// (DatasetOptions::format forces one) and applies to the whole file:
//   text               {"text": "..."}                   loss on every token
//   prompt_completion  {"prompt": "...", "completion": "..."}
//                                                        loss on the completion (and EOS) only
//   messages           {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
//                      rendered with the tokenizer's chat template (text/chat_template.h); loss on
//                      what each assistant turn produces (content through its end-of-turn token).
//                      "tool" messages and assistant "tool_calls" are refused: the native
//                      templates render neither
//   sharegpt           {"conversations": [{"from": "human"|"gpt"|"system"|..., "value": "..."}]}
//                      mapped to messages (human/user, gpt/assistant, system; tool, function and
//                      observation are tool turns: refused as above)
//   chat_prompt_completion (TRL's conversational prompt-completion)
//                      {"prompt": [messages], "completion": [messages]}: rendered as one chat;
//                      loss on the completion's assistant turns only
//   alpaca             {"instruction", "input" (optional, may be empty), "output"}: a user turn
//                      (instruction, plus "\n\n" + input when non-empty) and an assistant turn
//                      through the chat template when the tokenizer has one (or --chat-format
//                      names one); else prompt/completion with prompt = user turn + "\n\n"
//   plain_text         a .txt file: each document as text
//   tokens             a token file: windows of seq_len + 1 tokens with stride seq_len, loss on
//                      every token
// Text and prompt/completion documents get BOS when the tokenizer's config says add_bos and EOS
// after the document; chat samples get exactly the template's text (its BOS included).
//
// A sample is stored already shifted: inputs[t] and labels[t] = the token to predict at t, or
// kIgnoreLabel. The token ids are those of tokenizing the whole document at once (as transformers
// does); the loss mask comes from character spans mapped to tokens: a token is trained when its
// bytes overlap a trained span (the prompt/completion boundary token counts as completion).
//
// Bad input (invalid JSON, a missing field, a wrong type, an empty text/completion, a chat the
// template refuses, a conversation with no assistant turn) is an sf::Error "FILE:LINE: what is
// wrong" ("FILE: record N" in a JSON array), or with skip_bad_lines the record is skipped and
// counted in the DataReport.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "data/token_file.h"
#include "model/batch.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace sf {

enum class DataFormat {
  text,
  prompt_completion,
  messages,
  tokens,
  sharegpt,
  chat_prompt_completion,
  alpaca,
  plain_text
};
const char* data_format_name(DataFormat f);

struct DatasetOptions {
  std::string format = "auto";       // auto, or a data_format_name (data/data_source.h)
  std::string chat_format = "auto";  // auto: the tokenizer's chat_template; else a
                                     // named_chat_format name (chatml, llama3, mistral, ...)
  std::string chat_date;             // Llama 3.2+ "Today Date"; empty: today, as transformers
  int seq_len = 0;                   // tokens per packed row (and the token-file window)
  std::string overflow = "truncate";  // a sample longer than seq_len: truncate | split | drop
  bool skip_bad_lines = false;
  double eval_fraction = 0;          // of the training file, held out (ignored with eval_file)
  std::filesystem::path eval_file;   // a separate evaluation file (any format)
  std::filesystem::path tokenizer_dir;  // named in chat-template errors (its tokenizer_config.json)
};

// What loading a file found; summary() is one line for the log.
struct DataReport {
  std::filesystem::path path;
  DataFormat format = DataFormat::text;
  std::string chat_format;   // chat formats: the template recognised or forced
  std::string chat_date;     // Llama 3.2+: the "Today Date" rendered (record it for resume:
                             // pass it back as DatasetOptions::chat_date, or the text changes)
  int64_t lines = 0;         // records read (non-blank JSONL lines, array elements, documents)
  int64_t samples = 0;
  int64_t bad_lines = 0;     // skipped with skip_bad_lines
  std::vector<std::string> bad_examples;  // the first few "FILE:LINE: ..." messages
  int64_t no_loss = 0;       // samples dropped: nothing to learn (e.g. every label masked)
  int64_t mask_fallback = 0; // chat/prompt samples whose mask came from piecewise tokenization
  int64_t tokens = 0;        // input tokens over all samples
  int64_t loss_tokens = 0;   // labels that count
  std::string summary() const;
};

// Tokenized samples (in memory) or windows of a token file (memory-mapped).
class SampleSet {
 public:
  static std::shared_ptr<SampleSet> from_token_file(const std::filesystem::path& p, int seq_len);
  SampleSet() = default;

  int64_t size() const { return token_file_ ? n_windows_ : int64_t(offsets_.size()) - 1; }
  int64_t length(int64_t i) const;
  // Copies tokens [begin, begin + len) of sample i (inputs and labels).
  void read(int64_t i, int64_t begin, int64_t len, int32_t* inputs, int32_t* labels) const;
  int64_t valid_labels(int64_t i, int64_t begin, int64_t len) const;
  uint32_t max_token_id() const;
  // Content hash (in-memory samples: every token; token files: size and a stride of tokens).
  uint64_t fingerprint() const { return fingerprint_; }
  // A hash of sample i's content alone (the eval split ranks samples by it).
  uint64_t sample_hash(int64_t i) const;
  bool is_token_file() const { return bool(token_file_); }

  // Appends one document: tokens and per-token "is a target" flags (flag of tokens[0] unused).
  void add_document(const std::vector<int32_t>& tokens, const std::vector<uint8_t>& target);
  void finish();  // computes the fingerprint

 private:
  std::vector<int32_t> inputs_, labels_;
  std::vector<int64_t> offsets_{0};
  std::shared_ptr<TokenFile> token_file_;
  int64_t n_windows_ = 0;
  int seq_len_ = 0;
  uint64_t fingerprint_ = 0;
};

struct LoadedData {
  std::shared_ptr<SampleSet> samples;
  DataReport report;
};

// The format of `path`: `forced` (a data_format_name, or "prompt-completion" / "chat"), or on
// "auto" tokens for a token-file extension, plain_text for .txt, else the first record's
// fields (a record that does not parse fails here, unless skip_bad). Error(input) FILE:WHERE.
DataFormat detect_data_format(const std::filesystem::path& path, const std::string& forced,
                              bool skip_bad);

// Loads one file. `tok` may be null only for token files.
LoadedData load_dataset(const std::filesystem::path& path, const Tokenizer* tok,
                        const DatasetOptions& opt);

// The chat format messages are rendered with: opt.chat_format, or the tokenizer's template
// (errors name `source`), with the tokenizer's BOS/EOS token strings.
ChatFormat resolve_chat_format(const Tokenizer& tok, const std::string& chat_format,
                               const std::string& source);

// Tokens and target flags of one document (no BOS/EOS for chat: the template has them), as
// load_dataset makes them; exposed for tests and tools. Throws sf::Error(input) without FILE:LINE.
struct TokenizedDoc {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> target;  // 1: the token is predicted with loss
  bool mask_fallback = false;
};
TokenizedDoc tokenize_text(const Tokenizer& tok, const std::string& text);
TokenizedDoc tokenize_prompt_completion(const Tokenizer& tok, const std::string& prompt,
                                        const std::string& completion);
TokenizedDoc tokenize_chat(const Tokenizer& tok, const ChatFormat& fmt,
                           std::span<const ChatMessage> messages, const ChatRenderOptions& opt);

// Tokenizes `text` whole, with target flags on the tokens that overlap `spans` (byte ranges,
// sorted and disjoint); piecewise when the tokens do not spell the text (mask_fallback).
TokenizedDoc encode_with_spans(const Tokenizer& tok, std::string_view text,
                               const std::vector<std::pair<size_t, size_t>>& spans);

// Byte range of `text` covered by each token of `ids` (= tok.encode(text)); empty when the
// tokens do not spell the text (a normalizer changed it).
std::vector<std::pair<size_t, size_t>> token_byte_ranges(const Tokenizer& tok,
                                                         std::string_view text,
                                                         std::span<const int32_t> ids);

// Sample indices of the training and evaluation splits (each sorted ascending, disjoint).
struct DataSplit {
  std::vector<int64_t> train, eval;
};
// Holds out round(fraction * n) samples (at least 1 when fraction > 0 and n >= 2, at most n - 1):
// token files: the last windows (the stream's tail); JSONL: the samples of smallest content
// hash, so the held-out set does not depend on the file's order or the training seed.
DataSplit split_dataset(const SampleSet& s, double eval_fraction);

}  // namespace sf
