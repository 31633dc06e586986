// TensorBoard event files (events.out.tfevents.*), written without TensorFlow: a sequence of
// TFRecords, each holding one serialized tensorflow.Event protobuf.
//
// TFRecord framing, per record:  uint64 length (little endian)
//                                uint32 masked_crc32c(the 8 length bytes)
//                                the `length` data bytes
//                                uint32 masked_crc32c(the data)
// masked_crc32c(x) = rotate_right(crc32c(x), 15) + 0xa282ead8 (CRC-32C, Castagnoli).
//
// Event (tensorflow/core/util/event.proto), the fields written here:
//   1 wall_time double (fixed64)   2 step int64 (varint)
//   3 file_version string ("brain.Event:2", the first record of a file)   5 summary Summary
// Summary: 1 value (repeated) Summary.Value: 1 tag string, 2 simple_value float (fixed32).
// TensorBoard's scalar dashboard reads simple_value summaries as scalars.
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sf {

// CRC-32C (Castagnoli, reflected polynomial 0x82f63b78) of `n` bytes, and TFRecord's mask.
uint32_t crc32c(const void* data, size_t n);
uint32_t masked_crc32c(const void* data, size_t n);

struct TensorBoardScalar {
  std::string tag;  // e.g. "train/loss"
  float value = 0;
};

// The bytes of one Event record (framing included).
std::string tfevents_file_version_record(double wall_time);
std::string tfevents_scalars_record(double wall_time, int64_t step,
                                    const std::vector<TensorBoardScalar>& scalars);

// The name TensorBoard looks for: events.out.tfevents.<unix seconds>.<host>.
std::string tfevents_file_name(double wall_time);

// Appends events to one event file, each record flushed so that a running TensorBoard sees
// it. Error(io) naming the file when a write fails.
class TensorBoardWriter {
 public:
  TensorBoardWriter() = default;
  // Opens `file` (whole records so far, or none) for appending.
  explicit TensorBoardWriter(const std::filesystem::path& file);
  bool is_open() const { return stream_.is_open(); }
  const std::filesystem::path& file() const { return file_; }
  void write(std::string_view record);

 private:
  std::filesystem::path file_;
  std::ofstream stream_;
};

}  // namespace sf
