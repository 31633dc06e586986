// The memory sampler's parts: the /proc status fields it reads, growth after a step, the CSV
// it writes and its summary line. (A real run sampled step by step: tests/train/test_flat_memory.cpp.)
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/host_memory.h"
#include "report/memory_sampler.h"
#include "test_util.h"

namespace sf {
namespace {

constexpr size_t kMiB = size_t(1) << 20;

TEST(ProcessMemory, ReadsRssAndItsHighWaterMarkInKib) {
  test::TempDir tmp("sf-proc-status");
  const auto file = tmp.path / "status";
  std::ofstream(file) << "Name:\ttest\nVmPeak:\t  999 kB\nVmHWM:\t    5120 kB\nVmRSS:\t    "
                         "3072 kB\nRssAnon:\t 1 kB\nThreads:\t3\n";
  const ProcessMemory m = process_memory(file.string());
  EXPECT_EQ(m.rss_bytes, size_t(3072) * 1024);
  EXPECT_EQ(m.peak_rss_bytes, size_t(5120) * 1024);
  // Missing file or fields: 0, never a throw (a sample is never worth failing a run).
  const ProcessMemory none = process_memory((tmp.path / "absent").string());
  EXPECT_EQ(none.rss_bytes, 0u);
  EXPECT_EQ(none.peak_rss_bytes, 0u);
  // This process: resident, and its mark at least what is resident now.
  const ProcessMemory self = process_memory();
  EXPECT_GT(self.rss_bytes, kMiB);
  EXPECT_GE(self.peak_rss_bytes, self.rss_bytes);
}

TEST(MemoryGrowth, IsTheLargestExcessOverTheStepsSample) {
  std::vector<MemorySample> s = {{0, 100 * kMiB, 100 * kMiB, 0, 0},
                                 {1, 150 * kMiB, 160 * kMiB, 40 * kMiB, 0},
                                 {2, 151 * kMiB, 160 * kMiB, 40 * kMiB, 0},
                                 {3, 149 * kMiB, 160 * kMiB, 41 * kMiB, 0},
                                 {4, 153 * kMiB, 160 * kMiB, 40 * kMiB, 0},
                                 {5, 152 * kMiB, 160 * kMiB, 40 * kMiB, 0}};
  MemoryGrowth g = memory_growth_after(s, 1);
  EXPECT_EQ(g.rss_bytes, 3 * kMiB);  // step 4 over step 1
  EXPECT_EQ(g.rss_step, 4);
  EXPECT_EQ(g.gpu_bytes, kMiB);      // step 3
  EXPECT_EQ(g.gpu_step, 3);
  // Shrinking only is no growth.
  g = memory_growth_after(s, 4);
  EXPECT_EQ(g.rss_bytes, 0u);
  EXPECT_EQ(g.rss_step, -1);
  EXPECT_EQ(g.gpu_bytes, 0u);
  // Growth is measured from the given step, not from the start.
  EXPECT_EQ(memory_growth_after(s, 0).rss_bytes, 53 * kMiB);
  try {
    memory_growth_after(s, 9);
    ADD_FAILURE() << "no sample of step 9: expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no sample of that step"), std::string::npos) << e.what();
  }
}

std::vector<std::string> lines_of(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::vector<std::string> out;
  for (std::string l; std::getline(f, l);) out.push_back(l);
  return out;
}

TEST(MemorySampler, WritesABaselineAndOneRowPerSampleWithThePlan) {
  test::TempDir tmp("sf-mem-csv");
  const auto csv = tmp.path / "mem.csv";
  MemoryPlan plan{3 * kMiB, 5 * kMiB, false};
  MemorySampler mem(plan, csv);
  EXPECT_EQ(mem.samples().size(), 1u);  // the baseline, written at once
  EXPECT_EQ(lines_of(csv).size(), 2u);
  mem.sample(1, 4096, 8192);
  mem.sample(2, 4096, 8192);
  const auto lines = lines_of(csv);  // flushed per row: readable while the run goes on
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0], MemorySampler::csv_header());
  EXPECT_EQ(lines[0], "step,rss_bytes,peak_rss_bytes,gpu_bytes,plan_host_bytes,plan_device_bytes,"
                      "gpu_used_bytes");
  for (size_t i = 0; i < mem.samples().size(); ++i) {
    const MemorySample& s = mem.samples()[i];
    EXPECT_EQ(lines[i + 1], cat(s.step, ",", s.rss_bytes, ",", s.peak_rss_bytes, ",", s.gpu_bytes,
                                ",", 3 * kMiB, ",", 5 * kMiB, ",", s.gpu_used_bytes));
    EXPECT_GT(s.rss_bytes, 0u);
  }
  EXPECT_EQ(mem.samples()[0].gpu_bytes, 0u);
  EXPECT_EQ(mem.samples()[2].gpu_used_bytes, 8192u);
}

TEST(MemorySampler, RefusesALogItCannotWriteNamingIt) {
  test::TempDir tmp("sf-mem-csv");
  const auto bad = tmp.path / "missing-dir" / "mem.csv";
  try {
    MemorySampler mem({}, bad);
    ADD_FAILURE() << "expected an error for " << bad;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::io);
    EXPECT_NE(std::string(e.what()).find(bad.string() + ": cannot write the memory log"),
              std::string::npos)
        << e.what();
  }
}

TEST(MemorySampler, SummaryLineAgainstThePlan) {
  // Unified (the host backend): the resident set holds the plan's host and "device" bytes.
  MemorySampler mem({size_t(1) << 30, size_t(1) << 29, true});
  for (int s = 1; s <= 12; ++s) mem.sample(s, 64 * kMiB, 0);
  const std::string line = mem.summary_line(size_t(3) << 29, 10);
  EXPECT_EQ(line.rfind("memory: peak RSS ", 0), 0u) << line;
  EXPECT_NE(line.find(" GiB (plan 1.50, "), std::string::npos) << line;  // 1 GiB + 0.5 GiB
  EXPECT_NE(line.find("peak GPU 1.50 GiB (plan 0.50)"), std::string::npos) << line;
  EXPECT_NE(line.find("growth after step 10: "), std::string::npos) << line;
  EXPECT_NE(line.find(" MiB RSS, 0.00 MiB GPU"), std::string::npos) << line;
  // Not unified: only the host bytes bound the resident set. No sample after step 10: no
  // growth to state.
  MemorySampler short_run({size_t(1) << 30, size_t(1) << 29, false});
  for (int s = 1; s <= 10; ++s) short_run.sample(s, 0, 0);
  const std::string l2 = short_run.summary_line(0, 10);
  EXPECT_NE(l2.find(" GiB (plan 1.00, "), std::string::npos) << l2;
  EXPECT_EQ(l2.find("growth"), std::string::npos) << l2;
}

}  // namespace
}  // namespace sf
