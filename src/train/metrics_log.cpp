// MetricsLog (see metrics_log.h): the metrics.jsonl appender and the loss plot.
#include "train/metrics_log.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "io/atomic_file.h"
#include "report/plot.h"

namespace sf {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

double json_number(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : NAN;
}

}  // namespace

MetricsLog::MetricsLog(const fs::path& out, std::vector<json> history, std::string plot_title)
    : file_(out / "metrics.jsonl"),
      plot_file_(out / "loss.png"),
      history_(std::move(history)),
      plot_title_(std::move(plot_title)) {
  std::string text;
  for (auto& m : history_) text += m.dump() + "\n";
  write_file_atomic(file_, text);
  stream_.open(file_, std::ios::app);
  SF_REQUIRE(stream_.good(), file_.string(), ": cannot open for appending");
}

void MetricsLog::append(const json& record) {
  history_.push_back(record);
  errno = 0;
  stream_ << record.dump() << "\n";
  stream_.flush();
  if (!stream_.good()) {
    const int err = errno;
    SF_FAIL(io, file_.string(), ": write failed (", err ? std::strerror(err) : "stream error",
            ")");
  }
}

std::optional<std::string> MetricsLog::refresh_plot() const {
  try {
    LossCurves c;
    for (auto& m : history_) {
      const double x = json_number(m, "step"), l = json_number(m, "loss"),
                   e = json_number(m, "eval_loss");
      if (!std::isnan(l)) c.train.push_back({x, l});
      if (!std::isnan(e)) c.eval.push_back({x, e});
    }
    c.title = plot_title_;
    write_loss_plot(plot_file_, c);
  } catch (const Error& e) {
    return e.what();
  }
  return std::nullopt;
}

}  // namespace sf

