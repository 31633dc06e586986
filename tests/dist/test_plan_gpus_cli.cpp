// `slideformer plan --gpus N` end to end (the binary): the per-rank plan and the N-GPU lines,
// and the refusals (a batch that does not split, --gpu-link without --gpus, the host backend).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <string>

namespace {

struct PlanRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

PlanRun plan(const std::string& args) {
  const std::string bin = (std::filesystem::path(SF_BINARY_DIR) / "bin" / "slideformer").string();
  PlanRun r;
  FILE* p = popen((bin + " plan " + args + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

bool has(const PlanRun& r, const std::string& s) { return r.output.find(s) != std::string::npos; }

// The 8B shape (32 x 1024 per GPU) for a machine that is not this one (--backend cuda).
const std::string k8b = "--size llama3-8b --backend cuda --gpu-memory 24GiB --host-memory 200GiB --seq-len 1024 ";

TEST(PlanGpusCli, PredictsTwoGpusFromEachRanksPlan) {
  const PlanRun r = plan(k8b + "--batch-size 64 --gpus 2");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(has(r, "step       1 x 32768 tokens")) << "each rank plans 32 of the 64 sequences:\n" << r.output;
  EXPECT_TRUE(has(r, "gpus       2 data-parallel ranks over NVLink")) << r.output;
  EXPECT_TRUE(has(r, "= one shared copy ")) << r.output;
  EXPECT_TRUE(has(r, "tokens/s on 2 GPUs")) << r.output;
  EXPECT_TRUE(has(r, "fits       yes")) << r.output;
  const PlanRun pcie = plan(k8b + "--batch-size 64 --gpus 2 --gpu-link pcie");
  EXPECT_TRUE(has(pcie, "over PCIe")) << pcie.output;
}

TEST(PlanGpusCli, RefusesWhatCannotBePlanned) {
  const PlanRun odd = plan(k8b + "--batch-size 63 --gpus 2");
  EXPECT_NE(odd.exit_code, 0);
  EXPECT_TRUE(has(odd, "--batch-size 63 does not split over --gpus 2")) << odd.output;
  const PlanRun link = plan(k8b + "--batch-size 32 --gpu-link pcie");
  EXPECT_NE(link.exit_code, 0);
  EXPECT_TRUE(has(link, "it needs --gpus 2 or more")) << link.output;
  const PlanRun bad_link = plan(k8b + "--batch-size 64 --gpus 2 --gpu-link nvlink4");
  EXPECT_TRUE(has(bad_link, "--gpu-link \"nvlink4\" is not a link")) << bad_link.output;
  const PlanRun host = plan("--size tiny --backend host --batch-size 4 --gpus 2");
  EXPECT_NE(host.exit_code, 0);
  EXPECT_TRUE(has(host, "add --backend cuda")) << host.output;
  const PlanRun small_host = plan("--size llama3-8b --backend cuda --gpu-memory 24GiB --host-memory 64GiB --batch-size 64 --gpus 2");
  EXPECT_NE(small_host.exit_code, 0);
  EXPECT_TRUE(has(small_host, "fits       no")) << small_host.output;
}

}  // namespace
