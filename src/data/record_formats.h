// How one dataset record becomes a tokenized document, for every record format
// data/sample_set.h lists: which format a record's fields say, the checks of its fields (each
// failure an Error(input) naming the field, without FILE:LINE, which the loader adds), the
// mapping of Alpaca / ShareGPT / TRL records to chat messages, and the loss spans.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/sample_set.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace sf {

// The format a record's fields say: messages; conversations (sharegpt); prompt + completion
// (chat_prompt_completion when either is an array of messages); instruction + output
// (alpaca); text. Error(input) naming `where` and the fields found when none fits.
DataFormat format_of_record(const nlohmann::json& record, const std::string& where);

// True for the formats rendered with a chat template (alpaca: only when one is available).
bool format_renders_chat(DataFormat f);

struct RecordContext {
  DataFormat format = DataFormat::text;
  const Tokenizer* tok = nullptr;
  const ChatFormat* chat = nullptr;  // null: no chat template (alpaca: as prompt/completion)
  ChatRenderOptions render;
};

// One record (a parsed JSON object; plain_text: `text` is the document) as a document.
TokenizedDoc tokenize_record(const nlohmann::json& record, const RecordContext& c);
TokenizedDoc tokenize_document(const std::string& text, const RecordContext& c);

// ShareGPT's "from" values and the roles they map to (the error for another value lists them).
std::string sharegpt_role(const std::string& from);

}  // namespace sf
