// A file with no name, for scratch data that must not outlive the process (the optimizer's
// moments on disk, the disk probe): O_TMPFILE in `dir`, or where the filesystem lacks it a
// named file unlinked at once. Nothing is left behind, even after a crash.
#pragma once
#include <string>

namespace sf {

// Read-write, close-on-exec. try_direct: O_DIRECT when the filesystem has it (*direct says
// whether it was given). Returns the descriptor, or -1 with errno set.
int open_anonymous_file(const std::string& dir, bool try_direct = false, bool* direct = nullptr);

}  // namespace sf
