#include "core/host_memory.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace sf {

namespace {

namespace fs = std::filesystem;

// A cgroup v1 "no limit" is a page-rounded LLONG_MAX; anything this large means none.
constexpr size_t kNoLimit = size_t(1) << 60;

// The first number in a file ("max" or a missing file: kNoLimit).
size_t read_limit(const fs::path& p) {
  std::ifstream f(p);
  std::string s;
  if (!(f >> s) || s == "max") return kNoLimit;
  try {
    return size_t(std::stoull(s));
  } catch (...) {
    return kNoLimit;
  }
}

size_t read_number(const fs::path& p) {
  const size_t v = read_limit(p);
  return v == kNoLimit ? 0 : v;
}

// `key value` lines of a memory.stat.
size_t stat_value(const fs::path& p, const std::string& key) {
  std::ifstream f(p);
  std::string k;
  size_t v = 0;
  while (f >> k >> v)
    if (k == key) return v;
  return 0;
}

// What the cgroup at dir and its ancestors up to root still allow (kNoLimit: no limit).
size_t cgroup_room(fs::path dir, const fs::path& root, bool v2) {
  size_t room = kNoLimit;
  if (!fs::exists(dir)) dir = root;  // a cgroup namespace: the mount's root is ours
  for (;;) {
    const size_t limit = read_limit(dir / (v2 ? "memory.max" : "memory.limit_in_bytes"));
    if (limit < kNoLimit) {
      const size_t used = read_number(dir / (v2 ? "memory.current" : "memory.usage_in_bytes"));
      const size_t cache = stat_value(dir / "memory.stat", v2 ? "file" : "total_cache");
      const size_t busy = used > cache ? used - cache : 0;
      room = std::min(room, limit > busy ? limit - busy : 0);
    }
    if (dir == root || !dir.has_parent_path() || dir.parent_path() == dir) break;
    dir = dir.parent_path();
    if (dir.string().size() < root.string().size()) break;
  }
  return room;
}

}  // namespace

size_t host_available_bytes(const std::string& proc_root, const std::string& cgroup_root) {
  size_t avail = 0;
  {
    std::ifstream f(fs::path(proc_root) / "meminfo");
    std::string key, unit;
    size_t kb = 0;
    while (f >> key >> kb >> unit)
      if (key == "MemAvailable:") {
        avail = kb * 1024;
        break;
      }
  }
  if (avail == 0) return 0;
  std::ifstream f(fs::path(proc_root) / "self" / "cgroup");
  std::string line;
  while (std::getline(f, line)) {
    // "id:controllers:path"; v2 is "0::path"
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    const fs::path rel = fs::path(path).relative_path();
    if (controllers.empty()) {
      const fs::path root(cgroup_root);
      if (fs::exists(root / "cgroup.controllers"))  // the unified hierarchy is mounted here
        avail = std::min(avail, cgroup_room(root / rel, root, true));
      continue;
    }
    std::stringstream cs(controllers);
    std::string c;
    while (std::getline(cs, c, ','))
      if (c == "memory") {
        const fs::path root = fs::path(cgroup_root) / "memory";
        avail = std::min(avail, cgroup_room(root / rel, root, false));
      }
  }
  return avail;
}

size_t host_available_bytes() { return host_available_bytes("/proc", "/sys/fs/cgroup"); }

ProcessMemory process_memory(const std::string& status_file) {
  ProcessMemory m;
  std::ifstream f(status_file);
  std::string line;
  // "VmRSS:   123456 kB": the kernel always reports these two in kB.
  auto kib_field = [&line](const char* key, size_t& out) {
    const size_t n = std::char_traits<char>::length(key);
    if (line.compare(0, n, key) != 0) return;
    try {
      out = size_t(std::stoull(line.substr(n))) * 1024;
    } catch (...) {
      out = 0;
    }
  };
  while (std::getline(f, line)) {
    kib_field("VmRSS:", m.rss_bytes);
    kib_field("VmHWM:", m.peak_rss_bytes);
  }
  return m;
}

ProcessMemory process_memory() { return process_memory("/proc/self/status"); }

}  // namespace sf
