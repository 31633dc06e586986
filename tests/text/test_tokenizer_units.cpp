// Native tokenizer: load errors (each names the file and the field), BPE model details on
// tiny hand-made vocabularies (expected ids checked once against HF `tokenizers` 0.23.3),
// tokenizer_config.json fields, and the Unicode helpers.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/tokenizer.h"
#include "text/tokenizer_regex.h"
#include "text/tokenizer_unicode.h"
#include "test_util.h"

namespace sf {
namespace {

using json = nlohmann::json;

json tiny(json model) {
  return json{{"version", "1.0"}, {"added_tokens", json::array()}, {"normalizer", nullptr},
              {"pre_tokenizer", nullptr}, {"post_processor", nullptr}, {"decoder", nullptr},
              {"model", std::move(model)}};
}
json abc_model() {
  return json{{"type", "BPE"},
              {"vocab", {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}, {"abc", 5}}},
              {"merges", {"a b", "ab c"}}};
}

struct Files {
  test::TempDir dir{"sf-tokerr"};
  std::filesystem::path write(const std::string& text, const std::string& name = "tokenizer.json") {
    std::ofstream(dir.path / name) << text;
    return dir.path / name;
  }
  Tokenizer load(const json& j) { return Tokenizer::load(write(j.dump())); }
};

// load() must throw sf::Error whose message contains every one of `parts`.
void expect_load_error(const std::filesystem::path& p, std::initializer_list<std::string> parts) {
  try {
    Tokenizer::load(p);
    ADD_FAILURE() << "loading " << p << " did not throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& part : parts) EXPECT_NE(msg.find(part), std::string::npos) << "message: " << msg << "\nmissing: " << part;
  }
}

TEST(TokenizerErrors, MissingFileAndMalformedJson) {
  Files f;
  expect_load_error(f.dir.path / "nope", {"nope", "no such file"});
  const auto p = f.write("{\"model\": {\"type\": \"BPE\", ");
  expect_load_error(p, {p.string(), "malformed JSON"});
  expect_load_error(f.write("[1, 2]"), {"tokenizer.json", "expected a JSON object"});
  expect_load_error(f.write("{\"version\": \"1.0\"}"), {"tokenizer.json", "\"model\"", "missing"});
}

TEST(TokenizerErrors, UnsupportedModels) {
  Files f;
  json j = tiny({{"type", "Unigram"}, {"unk_id", 0}, {"vocab", {{"a", -1.0}}}});
  expect_load_error(f.write(j.dump()), {"tokenizer.json", "model.type", "unsupported model type \"Unigram\""});
  j = tiny({{"type", "WordPiece"}, {"vocab", {{"a", 0}}}});
  expect_load_error(f.write(j.dump()), {"model.type", "\"WordPiece\""});
  j = tiny({{"type", "WordLevel"}, {"vocab", {{"a", 0}}}});
  expect_load_error(f.write(j.dump()), {"model.type", "\"WordLevel\""});
}

TEST(TokenizerErrors, BadBpeFields) {
  Files f;
  json m = abc_model();
  m.erase("merges");
  expect_load_error(f.write(tiny(m).dump()), {"model.merges", "missing"});
  m = abc_model();
  m["merges"] = {"a b", "ab x"};
  expect_load_error(f.write(tiny(m).dump()), {"model.merges[1]", "\"x\" is not in the vocabulary"});
  m["merges"] = {"a b c"};
  expect_load_error(f.write(tiny(m).dump()), {"model.merges[0]", "two tokens"});
  m["merges"] = {"b c", "a bc"};  // "abc" is in the vocabulary, but "a"+"bc" is fine; break it:
  m["vocab"].erase("abc");
  expect_load_error(f.write(tiny(m).dump()), {"model.merges[1]", "merged token \"abc\""});
  m = abc_model();
  m["vocab"] = json::array({"a", "b"});
  expect_load_error(f.write(tiny(m).dump()), {"model.vocab"});
  m = abc_model();
  m["dropout"] = 0.1;
  expect_load_error(f.write(tiny(m).dump()), {"model.dropout"});
  m = abc_model();
  m["unk_token"] = "<unk>";
  expect_load_error(f.write(tiny(m).dump()), {"model.unk_token", "\"<unk>\" is not in the vocabulary"});
}

TEST(TokenizerErrors, UnknownPipelineSteps) {
  Files f;
  json j = tiny(abc_model());
  j["pre_tokenizer"] = {{"type", "Bogus"}};
  expect_load_error(f.write(j.dump()), {"pre_tokenizer.type", "unknown pre-tokenizer type \"Bogus\""});
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, {{"type", "Punctuation"}}}}};
  expect_load_error(f.write(j.dump()), {"pre_tokenizer.pretokenizers[1].type", "\"Punctuation\""});
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "\\w+"}}}, {"behavior", "Isolated"}, {"invert", false}};
  expect_load_error(f.write(j.dump()), {"pre_tokenizer.pattern.Regex", "unsupported split regex"});
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Sideways"}};
  expect_load_error(f.write(j.dump()), {"pre_tokenizer.behavior", "\"Sideways\""});
  j["pre_tokenizer"] = nullptr;
  j["normalizer"] = {{"type", "NFKC"}};
  expect_load_error(f.write(j.dump()), {"normalizer.type", "unsupported normalizer type \"NFKC\""});
  j["normalizer"] = nullptr;
  j["decoder"] = {{"type", "WordPiece"}, {"prefix", "##"}};
  expect_load_error(f.write(j.dump()), {"decoder.type", "unsupported decoder type \"WordPiece\""});
  j["decoder"] = {{"type", "Strip"}, {"content", "ab"}, {"start", 1}, {"stop", 0}};
  expect_load_error(f.write(j.dump()), {"decoder.content", "one character"});
  j["decoder"] = nullptr;
  j["added_tokens"] = {{{"content", "<x>"}}};
  expect_load_error(f.write(j.dump()), {"added_tokens[0].id"});
}

TEST(TokenizerErrors, BadConfig) {
  Files f;
  const auto tj = f.write(tiny(abc_model()).dump());
  f.write("{\"bos_token\": \"<s>\"}", "tokenizer_config.json");
  expect_load_error(tj, {"tokenizer_config.json", "bos_token", "\"<s>\" is not in the vocabulary"});
  f.write("{\"bos_token\": ", "tokenizer_config.json");
  expect_load_error(tj, {"tokenizer_config.json", "malformed JSON"});
  f.write("{\"add_bos_token\": \"yes\"}", "tokenizer_config.json");
  expect_load_error(tj, {"tokenizer_config.json", "add_bos_token"});
}

// ---- BPE details (expected values from HF tokenizers 0.23.3 on the same JSON) ----

TEST(TokenizerBpe, MergesByRank) {
  Files f;
  auto t = f.load(tiny(abc_model()));
  EXPECT_EQ(t.encode("abc"), (std::vector<int32_t>{5}));
  EXPECT_EQ(t.encode("abcab"), (std::vector<int32_t>{5, 3}));
  EXPECT_EQ(t.encode("cba"), (std::vector<int32_t>{2, 1, 0}));
  EXPECT_EQ(t.encode(""), (std::vector<int32_t>{}));
  json m = abc_model();
  m["merges"] = {"b c", "a b"};  // (b, c) ranks first, and "a bc" is no merge
  t = f.load(tiny(m));
  EXPECT_EQ(t.encode("abc"), (std::vector<int32_t>{0, 4}));
  EXPECT_EQ(t.encode("abab"), (std::vector<int32_t>{3, 3}));
  m["merges"] = json::array({json::array({"b", "c"}), json::array({"a", "b"})});  // list form
  t = f.load(tiny(m));
  EXPECT_EQ(t.encode("abc"), (std::vector<int32_t>{0, 4}));
}

TEST(TokenizerBpe, UnknownsFuseOrNot) {
  Files f;
  for (bool fuse : {true, false}) {
    json m{{"type", "BPE"}, {"vocab", {{"<unk>", 0}, {"a", 1}, {"b", 2}}}, {"merges", json::array()},
           {"unk_token", "<unk>"}, {"fuse_unk", fuse}};
    auto t = f.load(tiny(m));
    const std::vector<int32_t> want = fuse ? std::vector<int32_t>{1, 0, 2} : std::vector<int32_t>{1, 0, 0, 2};
    EXPECT_EQ(t.encode("axxb"), want);
    EXPECT_EQ(t.decode(t.encode("axxb")), fuse ? "a <unk> b" : "a <unk> <unk> b");  // no decoder: joined by spaces
  }
  // No unk_token: unknown characters are dropped.
  json m{{"type", "BPE"}, {"vocab", {{"a", 0}}}, {"merges", json::array()}};
  EXPECT_EQ(f.load(tiny(m)).encode("xax"), (std::vector<int32_t>{0}));
}

TEST(TokenizerBpe, ByteFallback) {
  Files f;
  json j = tiny({{"type", "BPE"}, {"vocab", {{"<unk>", 0}, {"<0xC3>", 1}, {"<0xA9>", 2}, {"a", 3}}},
                 {"merges", json::array()}, {"unk_token", "<unk>"}, {"byte_fallback", true}});
  j["decoder"] = {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}};
  auto t = f.load(j);
  EXPECT_EQ(t.encode("a\xC3\xA9" "a"), (std::vector<int32_t>{3, 1, 2, 3}));
  EXPECT_EQ(t.encode("\xE2\x82\xAC"), (std::vector<int32_t>{0}));  // bytes without tokens: unk
  const std::vector<int32_t> ids{1, 2, 3, 1, 3, 2};  // an invalid lone byte decodes to U+FFFD
  EXPECT_EQ(t.decode(ids), "\xC3\xA9" "a\xEF\xBF\xBD" "a\xEF\xBF\xBD");
}

TEST(TokenizerBpe, SubwordPrefixAndIgnoreMerges) {
  Files f;
  json m{{"type", "BPE"}, {"vocab", {{"a", 0}, {"##b", 1}, {"ab", 2}, {"b", 3}, {"##a", 4}}},
         {"merges", {"a ##b"}}, {"continuing_subword_prefix", "##"}};
  auto t = f.load(tiny(m));
  EXPECT_EQ(t.encode("ab"), (std::vector<int32_t>{2}));
  EXPECT_EQ(t.encode("ba"), (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(t.encode("aab"), (std::vector<int32_t>{0, 4, 1}));
  for (bool ignore : {true, false}) {
    json m2{{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}, {"abb", 3}}}, {"merges", {"a b"}},
            {"ignore_merges", ignore}};
    const std::vector<int32_t> want = ignore ? std::vector<int32_t>{3} : std::vector<int32_t>{2, 1};
    EXPECT_EQ(f.load(tiny(m2)).encode("abb"), want);
  }
}

TEST(TokenizerBpe, StripNormalizerWhitespaceSplitAndDecoders) {
  Files f;
  json j = tiny(abc_model());
  j["normalizer"] = {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}};
  j["pre_tokenizer"] = {{"type", "WhitespaceSplit"}};
  auto t = f.load(j);
  EXPECT_EQ(t.encode("  a b\tc  "), (std::vector<int32_t>{0, 1, 2}));
  j = tiny(abc_model());
  j["model"]["merges"] = {"a b"};
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders",
                   {{{"type", "Replace"}, {"pattern", {{"String", "a"}}}, {"content", " "}},
                    {{"type", "Fuse"}},
                    {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 1}}}}};
  EXPECT_EQ(f.load(j).decode(std::vector<int32_t>{0, 1, 0, 2, 0}), "b c");
}

TEST(TokenizerConfig, TokenObjectsTemplatesAndPostProcessorBos) {
  Files f;
  json j = tiny(abc_model());
  j["added_tokens"] = {{{"id", 6}, {"content", "<s>"}, {"special", true}},
                       {{"id", 7}, {"content", "</s>"}, {"special", true}}};
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}}};
  const auto tj = f.write(j.dump());
  // No tokenizer_config.json: BOS and add_bos come from the template.
  auto t = Tokenizer::load(tj);
  EXPECT_EQ(t.bos_id(), 6);
  EXPECT_TRUE(t.add_bos());
  EXPECT_EQ(t.eos_id(), std::nullopt);
  EXPECT_EQ(t.vocab_size(), 8);
  EXPECT_EQ(t.encode("ab<s>c</s>"), (std::vector<int32_t>{3, 6, 2, 7}));
  // As text, "<", "/", ">" and "s" have no tokens and are dropped; the rest merges to "abc".
  EXPECT_EQ(t.encode("ab<s>c</s>", /*parse_special=*/false), (std::vector<int32_t>{5}));
  EXPECT_EQ(t.decode(std::vector<int32_t>{3, 6, 2, 7}, /*skip_special=*/true), "ab c");
  f.write(R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>", "pad_token": null,
              "add_bos_token": false, "chat_template": [{"name": "tool_use", "template": "T"},
              {"name": "default", "template": "D"}]})",
          "tokenizer_config.json");
  t = Tokenizer::load(f.dir.path);
  EXPECT_EQ(t.bos_id(), 6);
  EXPECT_EQ(t.eos_id(), 7);
  EXPECT_EQ(t.pad_id(), std::nullopt);
  EXPECT_FALSE(t.add_bos());
  EXPECT_EQ(t.chat_template(), "D");
  f.write("{}", "tokenizer_config.json");
  f.write("{{ messages }}", "chat_template.jinja");
  EXPECT_EQ(Tokenizer::load(f.dir.path).chat_template(), "{{ messages }}");
}

// ---- Unicode helpers ----

TEST(TokenizerUnicode, AsciiFastPathMatchesTable) {
  for (char32_t c = 0; c < 128; ++c) EXPECT_EQ(uni::char_class(c), uni::char_class_slow(c)) << int(c);
  EXPECT_EQ(uni::char_class(0x4E2D), uni::kLetter | uni::kWord);   // CJK ideograph
  EXPECT_EQ(uni::char_class(0x0663), uni::kNumber | uni::kWord);   // Arabic-indic digit (Nd)
  EXPECT_EQ(uni::char_class(0x00BD), uni::kNumber);                // vulgar fraction (No)
  EXPECT_EQ(uni::char_class(0x3000), uni::kSpace);                 // ideographic space
  EXPECT_EQ(uni::char_class(0x001C), 0);                           // not White_Space
  EXPECT_EQ(uni::char_class(0x0301), uni::kWord);                  // combining mark
  EXPECT_EQ(uni::char_class(0x1F600), 0);                          // emoji
}

TEST(TokenizerUnicode, RepairMatchesPythonReplace) {
  // Expected strings from bytes.decode("utf-8", "replace") (maximal subparts).
  const std::string R = "\xEF\xBF\xBD";
  EXPECT_EQ(uni::repair_utf8("abc\xFF\xFE" "def"), "abc" + R + R + "def");
  EXPECT_EQ(uni::repair_utf8("\xE2\x82"), R);
  EXPECT_EQ(uni::repair_utf8("\xF0\x9F\x98"), R);
  EXPECT_EQ(uni::repair_utf8("\xED\xA0\x80"), R + R + R);
  EXPECT_EQ(uni::repair_utf8("\xC0\xAF"), R + R);
  EXPECT_EQ(uni::repair_utf8("\xF4\x90\x80\x80"), R + R + R + R);
  EXPECT_EQ(uni::repair_utf8("\xC3\x28"), R + "(");
  EXPECT_TRUE(uni::is_valid_utf8("plain ascii and \xC3\xA9 and \xF0\x9F\x98\x80"));
  EXPECT_FALSE(uni::is_valid_utf8("0123456789abcdef\x80"));
}

TEST(TokenizerUnicode, Nfc) {
  EXPECT_EQ(uni::nfc("cafe\xCC\x81"), "caf\xC3\xA9");                     // e + acute -> é
  EXPECT_EQ(uni::nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "\xEA\xB0\x81");  // jamo -> 각
  EXPECT_EQ(uni::nfc("e\xCC\x81\xCC\xA3"), "\xE1\xBA\xB9\xCC\x81");      // reorder: dot below first, then compose ẹ
  EXPECT_EQ(uni::nfc("\xE2\x84\xAB"), "\xC3\x85");                        // Angstrom sign -> Å (singleton)
  EXPECT_EQ(uni::nfc("plain"), "plain");
  EXPECT_TRUE(uni::nfc_quick_check("caf\xC3\xA9 \xE4\xB8\xAD"));
  EXPECT_FALSE(uni::nfc_quick_check("cafe\xCC\x81"));
}

TEST(TokenizerRegex, RecognizesKnownPatterns) {
  EXPECT_TRUE(tok::recognize_split_regex(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"));
  const auto l3 = tok::recognize_split_regex(
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)");
  ASSERT_TRUE(l3);
  EXPECT_EQ(l3->max_digits, 3);
  EXPECT_FALSE(tok::recognize_split_regex(R"(\w+|[^\w\s]+)"));
}

}  // namespace
}  // namespace sf
