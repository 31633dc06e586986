// The memory the planner may budget: MemAvailable capped by the process's memory cgroup (v1
// and v2) and its ancestors, their page cache counted as free. Fake /proc and cgroup trees.
#include <gtest/gtest.h>


#include <filesystem>
#include <fstream>

#include "core/host_memory.h"
#include "test_util.h"

namespace fs = std::filesystem;
using sf::host_available_bytes;

namespace {

constexpr size_t GiB = size_t(1) << 30;

struct Tree {
  sf::test::TempDir tmp{"sf-hostmem"};
  fs::path proc = tmp.path / "proc", cg = tmp.path / "cgroup";
  Tree() {
    fs::create_directories(proc / "self");
    fs::create_directories(cg);
    put(proc / "meminfo", "MemTotal:       134217728 kB\nMemAvailable:   104857600 kB\n");  // 100 GiB
  }
  static void put(const fs::path& p, const std::string& text) {
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  size_t available() const { return host_available_bytes(proc.string(), cg.string()); }
};

TEST(HostMemory, NoCgroupLimitIsMemAvailable) {
  Tree t;
  t.put(t.proc / "self" / "cgroup", "0::/user.slice/session-1.scope\n");
  t.put(t.cg / "cgroup.controllers", "cpu memory\n");
  t.put(t.cg / "user.slice" / "session-1.scope" / "memory.max", "max\n");
  EXPECT_EQ(t.available(), 100 * GiB);
}

TEST(HostMemory, CgroupV2LimitLessItsUseButNotItsCache) {
  Tree t;
  t.put(t.proc / "self" / "cgroup", "0::/docker/abc\n");
  t.put(t.cg / "cgroup.controllers", "cpu memory\n");
  const fs::path d = t.cg / "docker" / "abc";
  t.put(d / "memory.max", std::to_string(8 * GiB) + "\n");
  t.put(d / "memory.current", std::to_string(3 * GiB) + "\n");
  t.put(d / "memory.stat", "anon 2147483648\nfile " + std::to_string(1 * GiB) + "\n");
  EXPECT_EQ(t.available(), 6 * GiB);  // 8 - (3 - 1)
  // A tighter ancestor wins.
  t.put(t.cg / "docker" / "memory.max", std::to_string(5 * GiB) + "\n");
  t.put(t.cg / "docker" / "memory.current", std::to_string(3 * GiB) + "\n");
  EXPECT_EQ(t.available(), 2 * GiB);
}

TEST(HostMemory, CgroupV1LimitAndNamespacedPath) {
  Tree t;
  t.put(t.proc / "self" / "cgroup", "12:cpu,cpuacct:/\n4:memory:/kubepods/pod1/ctr\n0::/\n");
  const fs::path d = t.cg / "memory" / "kubepods" / "pod1" / "ctr";
  t.put(d / "memory.limit_in_bytes", std::to_string(4 * GiB) + "\n");
  t.put(d / "memory.usage_in_bytes", std::to_string(1 * GiB) + "\n");
  t.put(d / "memory.stat", "cache 536870912\ntotal_cache 536870912\n");
  t.put(t.cg / "memory" / "memory.limit_in_bytes", "9223372036854771712\n");  // no limit
  EXPECT_EQ(t.available(), 4 * GiB - GiB / 2);
  // In a cgroup namespace the path names a cgroup the mount does not show: its root is ours.
  Tree n;
  n.put(n.proc / "self" / "cgroup", "4:memory:/not/visible/here\n");
  n.put(n.cg / "memory" / "memory.limit_in_bytes", std::to_string(16 * GiB) + "\n");
  n.put(n.cg / "memory" / "memory.usage_in_bytes", "0\n");
  EXPECT_EQ(n.available(), 16 * GiB);
}

TEST(HostMemory, ThisMachineGivesSomething) {
  const size_t a = host_available_bytes();
  EXPECT_GT(a, size_t(64) << 20);
}

}  // namespace
