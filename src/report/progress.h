// What the trainer shows while it runs. On a terminal: one status line redrawn in place
// ("\r", cleared to the end) with a bar, step/total, loss, lr, tokens/s, model TFLOP/s,
// device and host memory, ETA; permanent messages (evaluations, saves) print above it.
// Elsewhere (a log file, a pipe): one plain line every log_every steps and at the last step.
// Also the measurements those lines need: model FLOPs of a step, resident set size.
#pragma once
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <span>
#include <string>

#include "io/model_config.h"
#include "model/batch.h"

namespace sf {

// Model FLOPs of one training step (forward + backward) over `micro`: 6 x (parameters that
// take part in matrix products) x tokens, plus causal attention 6 x q_dim x S(S+1) per
// sequence of length S and layer (QK^T and PV, half the square, 3x for backward). Recompute
// of the sliding window is not counted (it is overhead, not model work).
double step_model_flops(const ModelConfig& c, std::span<const Batch> micro);

// VmRSS of /proc/self/status in bytes (0 if unavailable).
size_t host_rss_bytes();

std::string format_duration(double seconds);  // "12.3s", "4m05s", "2h07m", "3d04h"
std::string format_mem(size_t bytes);          // "812M", "12.4G"
std::string format_rate(double per_second);    // "950", "12.3k", "4.56M"

struct ProgressSnapshot {
  int64_t step = 0, total = 0;
  double loss = 0, lr = 0, grad_norm = 0;
  double tokens_per_second = 0, tflops = 0;
  size_t device_bytes = 0;  // 0: not known (not shown)
  size_t host_bytes = 0;
  double eta_seconds = -1;  // < 0: not known yet
  int64_t epoch = 0;
};

// The status text (without "\r"), at most `width` columns; `bar` adds a progress bar when
// there is room, `gnorm` the gradient norm after the learning rate.
std::string format_status(const ProgressSnapshot& s, int width, bool bar, bool gnorm = false);

class ProgressDisplay {
 public:
  enum class Mode { bar, lines, quiet };
  ProgressDisplay(std::ostream& os, Mode mode, int64_t log_every, int columns = 0);
  ~ProgressDisplay();
  void update(const ProgressSnapshot& s);
  // A permanent line (evaluation, checkpoint, warning): clears the status line first and
  // redraws it afterwards. Quiet mode prints only lines marked `always`.
  void message(const std::string& line, bool always = false);
  void finish();  // leaves the last status line in place and ends it

 private:
  void clear_line();
  std::ostream& os_;
  Mode mode_;
  int64_t log_every_;
  int columns_;
  bool drawn_ = false;
  std::string last_;
};

// Columns of the terminal on `fd` (TIOCGWINSZ, else $COLUMNS, else 100).
int terminal_columns(int fd);

}  // namespace sf
