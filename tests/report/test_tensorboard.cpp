// TensorBoard event records: CRC-32C against its published check value; the writer's bytes for
// a fixed set of events equal the committed vector (tests/data/tensorboard/), whose records
// Python's tensorboard package read back as tests/data/tensorboard/expected.json lists
// (scripts/gen_tensorboard_vector.py); the committed bytes decode, with an independent reader
// (tests/tfevents_reader.h) that checks every CRC, to those values.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "report/tensorboard.h"
#include "test_util.h"
#include "tfevents_reader.h"

namespace sf::test {
namespace {

namespace fs = std::filesystem;

const fs::path kVectorDir = fs::path(SF_SOURCE_DIR) / "tests" / "data" / "tensorboard";

// The events of the vector: a file version, then scalars with one-byte and multi-byte steps,
// a negative value, a tiny and a huge one, and an eval-only event.
std::string vector_bytes() {
  std::string b = tfevents_file_version_record(1700000000.25);
  b += tfevents_scalars_record(1700000001.5, 1,
                               {{"train/loss", 10.8125f}, {"train/learning_rate", 2e-5f},
                                {"train/grad_norm", 1.5f}});
  b += tfevents_scalars_record(1700000002.75, 2, {{"train/loss", 9.25f}, {"eval/loss", 9.5f}});
  b += tfevents_scalars_record(1700000100.0, 300,
                               {{"train/loss", -0.125f}, {"memory/host_rss_gib", 3.0e-7f},
                                {"train/tokens_per_second", 123456.789f}});
  b += tfevents_scalars_record(1700000200.0, int64_t(1) << 33, {{"eval/loss", 1e30f}});
  return b;
}

TEST(TensorBoard, Crc32cMatchesTheCheckValue) {
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);  // CRC-32C's published check value
  EXPECT_EQ(crc32c("", 0), 0u);
  const std::string zeros(32, '\0');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8a9136aau);  // RFC 3720 B.4
}

TEST(TensorBoard, WriterBytesEqualTheCommittedVector) {
  const std::string bytes = vector_bytes();
  // Left in the build tree for scripts/gen_tensorboard_vector.py to regenerate the vector.
  const fs::path made = fs::path(SF_BINARY_DIR) / "tensorboard_vector" / "events.out.tfevents.vector";
  fs::create_directories(made.parent_path());
  write_file_atomic(made, bytes);
  EXPECT_EQ(bytes, read_file(kVectorDir / "events.out.tfevents.vector"))
      << "the writer's bytes changed; if on purpose, regenerate the vector "
         "(tests/data/tensorboard/README.md)";
}

TEST(TensorBoard, CommittedVectorDecodesToWhatTensorBoardRead) {
  const auto events = read_tfevents(read_file(kVectorDir / "events.out.tfevents.vector"));
  const auto expected = nlohmann::json::parse(read_file(kVectorDir / "expected.json"));
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events[0].file_version, expected.at("file_version").get<std::string>());
  EXPECT_EQ(events[0].wall_time, 1700000000.25);
  // expected.json: per tag, the (wall_time, step, value) list TensorBoard's
  // EventAccumulator.Scalars(tag) returned, in order.
  size_t checked = 0;
  for (auto& [tag, points] : expected.at("scalars").items()) {
    size_t i = 0;
    for (const auto& ev : events) {
      auto it = ev.scalars.find(tag);
      if (it == ev.scalars.end()) continue;
      ASSERT_LT(i, points.size()) << tag;
      const auto& p = points[i++];
      EXPECT_EQ(ev.wall_time, p.at("wall_time").get<double>()) << tag;
      EXPECT_EQ(ev.step, p.at("step").get<int64_t>()) << tag;
      // TensorBoard hands back the float32 widened to a double: bit equality.
      EXPECT_EQ(double(it->second), p.at("value").get<double>()) << tag << " step " << ev.step;
      ++checked;
    }
    EXPECT_EQ(i, points.size()) << tag;
  }
  EXPECT_EQ(checked, 9u);  // 3 + 2 + 3 + 1 values
}

TEST(TensorBoard, ReaderRefusesACorruptedRecord) {
  std::string bytes = vector_bytes();
  bytes[20] ^= 0x01;  // inside the first record's data
  EXPECT_THROW(read_tfevents(bytes), std::runtime_error);
  bytes = vector_bytes();
  bytes.resize(bytes.size() - 2);
  EXPECT_THROW(read_tfevents(bytes), std::runtime_error);
}

TEST(TensorBoard, FileNameIsOneTensorBoardFinds) {
  const std::string n = tfevents_file_name(1700000000.9);
  EXPECT_EQ(n.rfind("events.out.tfevents.1700000000.", 0), 0u) << n;
}

}  // namespace
}  // namespace sf::test
