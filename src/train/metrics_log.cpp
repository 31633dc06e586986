// MetricsLog (see metrics_log.h): the metrics.jsonl, metrics.csv and TensorBoard appenders and
// the loss plot.
#include "train/metrics_log.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "io/atomic_file.h"
#include "report/plot.h"

namespace sf {

namespace fs = std::filesystem;
using nlohmann::json;

const std::vector<std::string> kCsvColumns = {
    "step",          "loss",           "eval_loss",    "lr",
    "grad_norm",     "clip_coef",      "tokens",       "tokens_seen",
    "epoch",         "step_seconds",   "tokens_per_second", "tflops",
    "peak_device_bytes", "host_rss_bytes", "elapsed_seconds", "wall_time",
    "rss_gib",       "gpu_gib"};

namespace {

double json_number(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : NAN;
}

void check_written(std::ofstream& s, const fs::path& file) {
  s.flush();
  if (s.good()) return;
  const int err = errno;
  SF_FAIL(io, file.string(), ": write failed (", err ? std::strerror(err) : "stream error", ")");
}

// Records before wall_time was logged get the time the log opened.
double record_wall_time(const json& record) {
  const double t = json_number(record, "wall_time");
  if (!std::isnan(t)) return t;
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::string csv_row(const json& record) {
  std::string row;
  for (size_t i = 0; i < kCsvColumns.size(); ++i) {
    if (i) row += ',';
    auto it = record.find(kCsvColumns[i]);
    if (it != record.end() && it->is_number()) row += it->dump();  // shortest round trip
  }
  return row;
}

std::vector<TensorBoardScalar> tensorboard_scalars(const json& record) {
  static const std::vector<std::pair<const char*, const char*>> tags = {
      {"loss", "train/loss"},
      {"eval_loss", "eval/loss"},
      {"lr", "train/learning_rate"},
      {"grad_norm", "train/grad_norm"},
      {"tokens_per_second", "train/tokens_per_second"},
      {"epoch", "train/epoch"}};
  std::vector<TensorBoardScalar> out;
  for (auto& [key, tag] : tags)
    if (const double v = json_number(record, key); !std::isnan(v)) out.push_back({tag, float(v)});
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  for (auto [key, tag] : {std::pair{"peak_device_bytes", "memory/peak_device_gib"},
                          std::pair{"host_rss_bytes", "memory/host_rss_gib"}})
    if (const double v = json_number(record, key); !std::isnan(v))
      out.push_back({tag, float(v / kGiB)});
  // (rss_gib is memory/host_rss_gib's value: one chart, not two.)
  if (const double v = json_number(record, "gpu_gib"); !std::isnan(v))
    out.push_back({"memory/gpu_gib", float(v)});
  return out;
}

MetricsLog::MetricsLog(const fs::path& out, std::vector<json> history, std::string plot_title,
                       TensorBoardLog tensorboard)
    : file_(out / "metrics.jsonl"),
      csv_file_(out / "metrics.csv"),
      plot_file_(out / "loss.png"),
      history_(std::move(history)),
      plot_title_(std::move(plot_title)) {
  std::string text, csv;
  for (size_t i = 0; i < kCsvColumns.size(); ++i) csv += (i ? "," : "") + kCsvColumns[i];
  csv += "\n";
  for (auto& m : history_) {
    text += m.dump() + "\n";
    csv += csv_row(m) + "\n";
  }
  write_file_atomic(file_, text);
  write_file_atomic(csv_file_, csv);
  stream_.open(file_, std::ios::app);
  SF_REQUIRE(stream_.good(), file_.string(), ": cannot open for appending");
  csv_.open(csv_file_, std::ios::app);
  SF_REQUIRE(csv_.good(), csv_file_.string(), ": cannot open for appending");
  if (tensorboard == TensorBoardLog::on) open_tensorboard(out / "tensorboard");
}

// One event file holding the history; earlier sessions' files go (they may hold steps past
// the checkpoint this run resumed from).
void MetricsLog::open_tensorboard(const fs::path& dir) {
  fs::create_directories(dir);
  for (auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find("tfevents") != std::string::npos) fs::remove(e.path());
  const double now = record_wall_time(json::object());
  std::string records = tfevents_file_version_record(now);
  for (auto& m : history_)
    records += tfevents_scalars_record(record_wall_time(m), m.value("step", int64_t(0)),
                                       tensorboard_scalars(m));
  const fs::path file = dir / tfevents_file_name(now);
  write_file_atomic(file, records);
  events_ = TensorBoardWriter(file);
}

void MetricsLog::append(const json& record) {
  history_.push_back(record);
  errno = 0;
  stream_ << record.dump() << "\n";
  check_written(stream_, file_);
  csv_ << csv_row(record) << "\n";
  check_written(csv_, csv_file_);
  if (events_.is_open())
    events_.write(tfevents_scalars_record(record_wall_time(record), record.value("step", int64_t(0)),
                                          tensorboard_scalars(record)));
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
