// A reader of TensorBoard event files for tests, written apart from report/tensorboard.cpp
// (its own CRC-32C, bitwise, and its own protobuf decoding) so that a mistake in the writer
// is not mirrored here: every record's length and data CRCs are checked, and the Events are
// decoded into wall time, step, file_version and the scalar values of the summary.
#pragma once
#include <cstdint>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace sf::test {

struct DecodedEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::map<std::string, float> scalars;  // tag -> simple_value
};

inline uint32_t bitwise_crc32c(const uint8_t* p, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1u)));
  }
  return ~c;
}

inline uint32_t unmasked(uint32_t masked) {
  const uint32_t r = masked - 0xa282ead8u;
  return (r << 15) | (r >> 17);
}

class ProtoCursor {
 public:
  ProtoCursor(const uint8_t* p, size_t n) : p_(p), end_(p + n) {}
  bool done() const { return p_ >= end_; }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      need(1);
      const uint8_t b = *p_++;
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    throw std::runtime_error("varint longer than 10 bytes");
  }
  template <class T>
  T fixed() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  ProtoCursor sub() {
    const uint64_t n = varint();
    need(n);
    ProtoCursor c(p_, size_t(n));
    p_ += n;
    return c;
  }
  std::string bytes() {
    ProtoCursor c = sub();
    return std::string(reinterpret_cast<const char*>(c.p_), size_t(c.end_ - c.p_));
  }
  void skip(int wire_type) {
    if (wire_type == 0) (void)varint();
    else if (wire_type == 1) (void)fixed<uint64_t>();
    else if (wire_type == 2) (void)sub();
    else if (wire_type == 5) (void)fixed<uint32_t>();
    else throw std::runtime_error("unknown wire type " + std::to_string(wire_type));
  }

 private:
  void need(uint64_t n) const {
    if (uint64_t(end_ - p_) < n) throw std::runtime_error("protobuf field runs past its message");
  }
  const uint8_t* p_;
  const uint8_t* end_;
};

inline void decode_summary(ProtoCursor s, DecodedEvent& e) {
  while (!s.done()) {
    const uint64_t key = s.varint();
    if (key != (1 << 3 | 2)) {
      s.skip(int(key & 7));
      continue;
    }
    ProtoCursor v = s.sub();
    std::string tag;
    float value = 0;
    while (!v.done()) {
      const uint64_t k = v.varint();
      if (k == (1 << 3 | 2)) tag = v.bytes();
      else if (k == (2 << 3 | 5)) value = v.fixed<float>();
      else v.skip(int(k & 7));
    }
    e.scalars[tag] = value;
  }
}

inline DecodedEvent decode_event(const uint8_t* p, size_t n) {
  DecodedEvent e;
  ProtoCursor c(p, n);
  while (!c.done()) {
    const uint64_t key = c.varint();
    const int field = int(key >> 3), type = int(key & 7);
    if (field == 1 && type == 1) e.wall_time = c.fixed<double>();
    else if (field == 2 && type == 0) e.step = int64_t(c.varint());
    else if (field == 3 && type == 2) e.file_version = c.bytes();
    else if (field == 5 && type == 2) decode_summary(c.sub(), e);
    else c.skip(type);
  }
  return e;
}

// Every record of an event file's bytes; throws std::runtime_error for a bad CRC or a
// truncated record.
inline std::vector<DecodedEvent> read_tfevents(const std::string& bytes) {
  std::vector<DecodedEvent> events;
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  size_t at = 0;
  while (at < bytes.size()) {
    if (bytes.size() - at < 12) throw std::runtime_error("truncated record header");
    uint64_t len;
    uint32_t len_crc, data_crc;
    std::memcpy(&len, p + at, 8);
    std::memcpy(&len_crc, p + at + 8, 4);
    if (unmasked(len_crc) != bitwise_crc32c(p + at, 8))
      throw std::runtime_error("length CRC mismatch at byte " + std::to_string(at));
    if (bytes.size() - at - 12 < len + 4) throw std::runtime_error("truncated record data");
    std::memcpy(&data_crc, p + at + 12 + len, 4);
    if (unmasked(data_crc) != bitwise_crc32c(p + at + 12, size_t(len)))
      throw std::runtime_error("data CRC mismatch at byte " + std::to_string(at));
    events.push_back(decode_event(p + at + 12, size_t(len)));
    at += 12 + len + 4;
  }
  return events;
}

}  // namespace sf::test
