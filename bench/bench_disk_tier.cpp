// bench_disk_tier: the disk tier of --optimizer-dir (src/optim/state_disk.h) against the
// disk's own sequential bandwidth; not a test.
//
//   build-x/bin/bench_disk_tier --dir DIR [--gib 4] [--unit-mib 64,256,872] [--slots 2]
//                               [--request-kib 1024] [--qd 16] [--sweep-queue] [--sweeps 3]
//                               [--compute]
//
// 1. The disk: one O_DIRECT file of --gib, written sequentially (twice: the first pass also
//    converts the reserved blocks; the second is timed), then read, then half written while the
//    other half is read (io/direct_file.h: measure_disk_rates), at --request-kib x --qd.
//    --sweep-queue first times request sizes x queue depths on a quarter of the file, to choose
//    the defaults.
// 2. The tier: the same bytes as units of --unit-mib (two parts each, m and v), swept as the
//    optimizer does (prefetch the next unit, acquire, update, release) --sweeps times, the first untimed (it reads the file's unwritten zeros). Reported: GB/s of reads
//    plus writes, as a percentage of the disk's rate for the same traffic both at once, and
//    one after the other (2 / (1 / read + 1 / write)).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/direct_file.h"
#include "optim/state_disk.h"

using namespace sf;

namespace {

std::vector<size_t> split_sizes(const std::string& s) {
  std::vector<size_t> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t e = s.find(',', pos);
    if (e == std::string::npos) e = s.size();
    out.push_back(std::stoull(s.substr(pos, e - pos)));
    pos = e + 1;
  }
  return out;
}

// The bytes this process has had the block layer read and write (/proc/self/io): what the
// tier really moved, as a check on its own count (0 where the file cannot be read).
size_t process_disk_bytes() {
  std::FILE* f = std::fopen("/proc/self/io", "r");
  if (!f) return 0;
  char key[64];
  unsigned long long v = 0, total = 0;
  while (std::fscanf(f, "%63s %llu", key, &v) == 2)
    if (std::strcmp(key, "read_bytes:") == 0 || std::strcmp(key, "write_bytes:") == 0) total += v;
  std::fclose(f);
  return size_t(total);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Args {
  std::string dir;
  size_t bytes = size_t(4) << 30;
  std::vector<size_t> unit_mib = {64, 256, 872};
  int slots = 2, sweeps = 3, qd = 16;
  size_t request = size_t(1) << 20;
  bool sweep_queue = false;
  bool compute = false;  // the update reads and writes every moment (else it touches a byte per page)
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto val = [&]() -> std::string {
      SF_REQUIRE(i + 1 < argc, "bench_disk_tier: ", k, " needs a value");
      return argv[++i];
    };
    if (k == "--dir") a.dir = val();
    else if (k == "--gib") a.bytes = size_t(std::stod(val()) * double(size_t(1) << 30)) / (64 << 20) * (64 << 20);
    else if (k == "--unit-mib") a.unit_mib = split_sizes(val());
    else if (k == "--slots") a.slots = std::stoi(val());
    else if (k == "--sweeps") a.sweeps = std::stoi(val());
    else if (k == "--request-kib") a.request = std::stoull(val()) << 10;
    else if (k == "--qd") a.qd = std::stoi(val());
    else if (k == "--sweep-queue") a.sweep_queue = true;
    else if (k == "--compute") a.compute = true;
    else SF_REQUIRE(false, "bench_disk_tier: unknown flag ", k, " (see the file's header)");
  }
  SF_REQUIRE(!a.dir.empty(), "bench_disk_tier: give --dir DIR (a directory on the disk to measure)");
  SF_REQUIRE(a.sweeps >= 2, "bench_disk_tier: --sweeps ", a.sweeps, ": at least 2 (the first is untimed)");
  return a;
}

DiskRates measure_disk(const Args& a, size_t bytes, size_t request, int qd) {
  DirectFileOptions o;
  o.request_bytes = request;
  o.queue_depth = qd;
  const DiskRates r = measure_disk_rates(a.dir, bytes, o);
  std::printf("  disk  %5zu KiB x %3d: write %6.2f GB/s  read %6.2f GB/s  both at once %6.2f GB/s  (%s, %s)\n",
              request >> 10, qd, r.write / 1e9, r.read / 1e9, r.mixed / 1e9, r.direct ? "O_DIRECT" : "buffered",
              filesystem_name(a.dir).c_str());
  std::fflush(stdout);
  return r;
}

double serial(const DiskRates& r) { return 2.0 / (1.0 / r.read + 1.0 / r.write); }

// The update of one unit: with compute, a pass over every moment as fp32 (AdamW's moment
// traffic, without its arithmetic); else one byte per 4 KiB page changes.
void update(const UnitBytes& b, bool compute, int sweep) {
  for (int p = 0; p < b.n_parts; ++p) {
    if (!compute) {
      for (size_t i = 0; i < b.bytes[size_t(p)]; i += 4096) b.part[size_t(p)][i] = std::byte(sweep + 1);
      continue;
    }
    float* x = reinterpret_cast<float*>(b.part[size_t(p)]);
    const size_t n = b.bytes[size_t(p)] / sizeof(float);
    for (size_t i = 0; i < n; ++i) x[i] = x[i] * 0.9f + 1e-3f;
  }
}

// Seconds of update per sweep with no disk at all (one slot's unit updated n_units times).
double compute_only_seconds(const UnitBytes& b, size_t n_units) {
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t u = 0; u < n_units; ++u) update(b, true, int(u));
  return seconds_since(t0);
}

// The optimizer's sweep over the tier; returns bytes read + written per second (timed sweeps).
double measure_tier(const Args& a, size_t unit_bytes, const DiskRates& disk) {
  const size_t n_units = a.bytes / unit_bytes;
  if (n_units < size_t(a.slots) + 2) {  // else units stay in clean slots and skip the disk
    std::printf("  tier  %5zu MiB units: skipped, %zu units for %d slots (raise --gib)\n", unit_bytes >> 20, n_units, a.slots);
    return 0;
  }
  std::vector<std::vector<size_t>> parts(n_units, {unit_bytes / 2, unit_bytes / 2});
  DirectFileOptions o;
  o.request_bytes = a.request;
  o.queue_depth = a.qd;
  StateDisk d(a.dir, parts, a.slots, o);
  double timed = 0;
  size_t disk_bytes = 0;
  for (int s = 0; s < a.sweeps; ++s) {
    const size_t b0 = process_disk_bytes();
    const auto t0 = std::chrono::steady_clock::now();
    d.prefetch(0);
    for (size_t u = 0; u < n_units; ++u) {
      if (u + 1 < n_units) d.prefetch(int(u + 1));
      const UnitBytes b = d.acquire(int(u));
      update(b, a.compute, s);
      d.release(int(u));
    }
    d.flush();
    if (s > 0) {
      timed += seconds_since(t0);
      disk_bytes += process_disk_bytes() - b0;
    }
  }
  const double rate = 2.0 * double(d.file_bytes()) * double(a.sweeps - 1) / timed;
  if (a.compute) {  // overlapped when a sweep takes about the longer of disk and update alone
    const UnitBytes b = d.acquire(0);
    const double upd = compute_only_seconds(b, n_units);
    d.release(0, SlotRelease::unchanged);
    const double disk_s = 2.0 * double(d.file_bytes()) / disk.mixed;
    std::printf("  tier  per sweep: update alone %.2f s, disk alone %.2f s (at both at once), both %.2f s\n", upd,
                disk_s, timed / double(a.sweeps - 1));
  }
  std::printf("  tier  %5zu MiB units x %3zu, %d slots: %6.2f GB/s read+write = %5.1f%% of both at once, "
              "%5.1f%% of one after the other (the block layer moved %.2f GB of the %.2f GB counted)\n",
              unit_bytes >> 20, n_units, a.slots, rate / 1e9, 100.0 * rate / disk.mixed, 100.0 * rate / serial(disk),
              double(disk_bytes) / 1e9, 2.0 * double(d.file_bytes()) * double(a.sweeps - 1) / 1e9);
  std::fflush(stdout);
  return rate;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    if (a.sweep_queue) {
      std::printf("request size x queue depth (%zu MiB):\n", (a.bytes / 4) >> 20);
      for (size_t req : {size_t(256) << 10, size_t(1) << 20, size_t(4) << 20})
        for (int qd : {2, 8, 16, 32}) measure_disk(a, a.bytes / 4 / (32 << 20) * (32 << 20), req, qd);
    }
    std::printf("the disk (%zu MiB):\n", a.bytes >> 20);
    const DiskRates disk = measure_disk(a, a.bytes, a.request, a.qd);
    std::printf("the tier:\n");
    for (size_t mib : a.unit_mib) measure_tier(a, (mib << 20) / 8192 * 8192, disk);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_disk_tier: %s\n", e.what());
    return 1;
  }
}
