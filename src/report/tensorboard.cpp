// TensorBoard event records encoded by hand (the format is in tensorboard.h).
#include "report/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace sf {

namespace {

constexpr std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    t[i] = c;
  }
  return t;
}

// ---- protobuf wire format: varint (type 0), fixed64 (1), length-delimited (2), fixed32 (5)
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += char(uint8_t(v) | 0x80);
    v >>= 7;
  }
  out += char(uint8_t(v));
}
void put_tag(std::string& out, int field, int wire_type) {
  put_varint(out, uint64_t(field) << 3 | uint64_t(wire_type));
}
void put_fixed(std::string& out, const void* p, size_t n) {
  // Little endian on the wire, as on x86-64 and every platform we build for.
  out.append(static_cast<const char*>(p), n);
}
void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}

std::string event_header(double wall_time, int64_t step) {
  std::string e;
  put_tag(e, 1, 1);
  put_fixed(e, &wall_time, 8);
  if (step != 0) {  // proto3: a default value is not written
    put_tag(e, 2, 0);
    put_varint(e, uint64_t(step));
  }
  return e;
}

void put_u32(std::string& out, uint32_t v) { put_fixed(out, &v, 4); }

std::string framed(const std::string& data) {
  std::string r;
  const uint64_t len = data.size();
  put_fixed(r, &len, 8);
  put_u32(r, masked_crc32c(&len, 8));
  r += data;
  put_u32(r, masked_crc32c(data.data(), data.size()));
  return r;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  static constexpr std::array<uint32_t, 256> table = crc32c_table();
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfevents_file_version_record(double wall_time) {
  std::string e = event_header(wall_time, 0);
  put_bytes(e, 3, "brain.Event:2");
  return framed(e);
}

std::string tfevents_scalars_record(double wall_time, int64_t step,
                                    const std::vector<TensorBoardScalar>& scalars) {
  std::string summary;
  for (const TensorBoardScalar& s : scalars) {
    std::string value;
    put_bytes(value, 1, s.tag);
    put_tag(value, 2, 5);
    put_fixed(value, &s.value, 4);
    put_bytes(summary, 1, value);
  }
  std::string e = event_header(wall_time, step);
  put_bytes(e, 5, summary);
  return framed(e);
}

std::string tfevents_file_name(double wall_time) {
  char host[256] = "localhost";
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
  host[sizeof host - 1] = 0;
  return cat("events.out.tfevents.", int64_t(std::floor(wall_time)), ".", host);
}

TensorBoardWriter::TensorBoardWriter(const std::filesystem::path& file) : file_(file) {
  stream_.open(file_, std::ios::binary | std::ios::app);
  SF_REQUIRE(stream_.good(), file_.string(), ": cannot open for appending");
}

void TensorBoardWriter::write(std::string_view record) {
  errno = 0;
  stream_.write(record.data(), std::streamsize(record.size()));
  stream_.flush();
  if (!stream_.good()) {
    const int err = errno;
    SF_FAIL(io, file_.string(), ": write failed (", err ? std::strerror(err) : "stream error",
            ")");
  }
}

}  // namespace sf
