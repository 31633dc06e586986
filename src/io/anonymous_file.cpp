#include "io/anonymous_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>

namespace sf {

int open_anonymous_file(const std::string& dir, bool try_direct, bool* direct) {
  int fd = -1;
  if (try_direct) fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
  if (direct) *direct = fd >= 0;
  if (fd < 0) fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::string path = dir + "/slideformer-scratch-XXXXXX";
    fd = ::mkostemp(path.data(), O_CLOEXEC);
    if (fd >= 0) ::unlink(path.c_str());
  }
  return fd;
}

}  // namespace sf
