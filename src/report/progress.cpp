#include "report/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <vector>

namespace sf {

double step_model_flops(const ModelConfig& c, std::span<const Batch> micro) {
  // Parameters in matrix products: all but the embedding table when it is not also the head
  // (a lookup does no arithmetic).
  const double table = double(c.vocab_size) * double(c.hidden_size);
  const double n_matmul = double(c.num_parameters()) - (c.tie_word_embeddings ? 0.0 : table);
  double tokens = 0, attn = 0;
  for (const Batch& b : micro) {
    tokens += double(b.n_tokens());
    for (int s = 0; s < b.n_seqs(); ++s) {
      const double len = double(b.cu_seqlens[size_t(s) + 1] - b.cu_seqlens[size_t(s)]);
      attn += 6.0 * double(c.q_dim()) * len * (len + 1);
    }
  }
  return 6.0 * n_matmul * tokens + attn * double(c.num_hidden_layers);
}

size_t host_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      long long kb = std::atoll(line.c_str() + 6);
      return kb > 0 ? size_t(kb) * 1024 : 0;
    }
  }
  return 0;
}

std::string format_duration(double s) {
  char buf[32];
  if (!std::isfinite(s) || s < 0) return "?";
  if (s < 60) std::snprintf(buf, sizeof buf, "%.1fs", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%dm%02ds", int(s / 60), int(s) % 60);
  else if (s < 86400) std::snprintf(buf, sizeof buf, "%dh%02dm", int(s / 3600), int(s / 60) % 60);
  else std::snprintf(buf, sizeof buf, "%dd%02dh", int(s / 86400), int(s / 3600) % 24);
  return buf;
}

std::string format_mem(size_t bytes) {
  char buf[32];
  const double mib = double(bytes) / double(1 << 20);
  if (mib < 1024) std::snprintf(buf, sizeof buf, "%.0fM", mib);
  else std::snprintf(buf, sizeof buf, "%.1fG", mib / 1024);
  return buf;
}

std::string format_rate(double v) {
  char buf[32];
  if (!std::isfinite(v)) return "?";
  if (v < 1e3) std::snprintf(buf, sizeof buf, "%.0f", v);
  else if (v < 1e6) std::snprintf(buf, sizeof buf, "%.3gk", v / 1e3);
  else std::snprintf(buf, sizeof buf, "%.3gM", v / 1e6);
  return buf;
}

std::string format_status(const ProgressSnapshot& s, int width, bool bar, bool gnorm) {
  char buf[64];
  std::ostringstream os;
  const int digits = int(std::to_string(s.total).size());
  std::snprintf(buf, sizeof buf, "step %*lld/%lld", digits, (long long)s.step, (long long)s.total);
  std::string head = buf;
  std::snprintf(buf, sizeof buf, "loss %.4f", s.loss);
  std::string loss = buf;
  std::snprintf(buf, sizeof buf, "lr %.2e", s.lr);
  std::string lr = buf;
  if (gnorm) {
    std::snprintf(buf, sizeof buf, "  gnorm %.3g", s.grad_norm);
    lr += buf;
  }
  std::string tps = format_rate(s.tokens_per_second) + " tok/s";
  std::snprintf(buf, sizeof buf, "%.3g TFLOP/s", s.tflops);
  std::string tfl = buf;
  std::string mem = (s.device_bytes ? "dev " + format_mem(s.device_bytes) + " " : std::string()) +
                    "host " + format_mem(s.host_bytes);
  std::string eta = "eta " + (s.eta_seconds < 0 ? std::string("?") : format_duration(s.eta_seconds));
  // Shown in this order; when the width is short, parts are dropped from the least important
  // (the bar, then memory, TFLOP/s, tokens/s, lr); step, loss and ETA stay.
  std::string bar_text;
  if (bar && s.total > 0) {
    const int n = 20;
    const int fill = int(double(n) * double(s.step) / double(s.total));
    bar_text = "[" + std::string(size_t(fill), '#') + std::string(size_t(n - fill), '.') + "]";
  }
  std::vector<std::string> parts = {bar_text, head, loss, lr, tps, tfl, mem, eta};
  const int priority[] = {7, 0, 1, 3, 4, 5, 6, 2};  // lower: kept longer
  std::vector<bool> keep(parts.size(), false);
  int used = 0;
  for (int rank = 0; rank < 8; ++rank)
    for (size_t i = 0; i < parts.size(); ++i) {
      if (priority[i] != rank || parts[i].empty()) continue;
      const int need = int(parts[i].size()) + (used ? 2 : 0);
      if (used + need <= width || rank <= 1) {
        keep[i] = true;
        used += need;
      }
    }
  std::string line;
  for (size_t i = 0; i < parts.size(); ++i)
    if (keep[i]) line += (line.empty() ? "" : "  ") + parts[i];
  if (int(line.size()) > width) line.resize(size_t(std::max(0, width)));
  return line;
}

int terminal_columns(int fd) {
  struct winsize w {};
  if (::ioctl(fd, TIOCGWINSZ, &w) == 0 && w.ws_col > 0) return w.ws_col;
  if (const char* c = std::getenv("COLUMNS")) {
    int n = std::atoi(c);
    if (n > 0) return n;
  }
  return 100;
}

ProgressDisplay::ProgressDisplay(std::ostream& os, Mode mode, int64_t log_every, int columns)
    : os_(os), mode_(mode), log_every_(std::max<int64_t>(1, log_every)),
      columns_(columns > 0 ? columns : 100) {}

ProgressDisplay::~ProgressDisplay() {
  if (drawn_) os_ << "\n" << std::flush;
}

void ProgressDisplay::clear_line() {
  if (drawn_) os_ << "\r\x1b[K";
}

void ProgressDisplay::update(const ProgressSnapshot& s) {
  if (mode_ == Mode::quiet) return;
  if (mode_ == Mode::bar) {
    // Leave one column free: writing the last column makes some terminals wrap.
    last_ = format_status(s, columns_ - 1, true);
    os_ << "\r" << last_ << "\x1b[K" << std::flush;
    drawn_ = true;
    return;
  }
  if (s.step % log_every_ == 0 || s.step == s.total || s.step == 1) {
    os_ << format_status(s, 1000, false, true) << "\n" << std::flush;
  }
}

void ProgressDisplay::message(const std::string& line, bool always) {
  if (mode_ == Mode::quiet && !always) return;
  clear_line();
  os_ << line << "\n";
  if (drawn_) os_ << last_ << "\x1b[K";
  os_ << std::flush;
}

void ProgressDisplay::finish() {
  if (drawn_) os_ << "\n" << std::flush;
  drawn_ = false;
}

}  // namespace sf
