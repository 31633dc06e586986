// How much memory this process may still take: what the planner budgets by default.
//
// /proc/meminfo's MemAvailable alone is the machine's: in a container or a systemd slice with
// a memory limit, the cgroup's OOM killer strikes long before that is used up. So the answer
// is MemAvailable capped by the limit of the process's memory cgroup and of each of its
// ancestors (cgroup v2 memory.max / v1 memory.limit_in_bytes), less what each already uses,
// its page cache counted as free (the kernel reclaims that first).
//
// Also what this process holds now: its resident set and that set's high-water mark.
#pragma once
#include <cstddef>
#include <string>

namespace sf {

size_t host_available_bytes();
// The same read from other roots (tests): proc_root holds meminfo and self/cgroup,
// cgroup_root is the cgroup mount (/sys/fs/cgroup). 0 when MemAvailable cannot be read.
size_t host_available_bytes(const std::string& proc_root, const std::string& cgroup_root);

// VmRSS and VmHWM of one /proc/<pid>/status read (one open and read per call, so a per-step
// sample costs microseconds). 0 for a field the file does not have (not Linux).
struct ProcessMemory {
  size_t rss_bytes = 0;       // resident now
  size_t peak_rss_bytes = 0;  // the most resident at once since the process started
};
ProcessMemory process_memory();
ProcessMemory process_memory(const std::string& status_file);  // tests: another status file

}  // namespace sf
