// A run's metrics, one record per step (plus the evaluation before the first step), in every
// form a user reads them:
//   <out>/metrics.jsonl           one JSON object per line
//   <out>/metrics.csv             the same records, one row each, fixed columns (kCsvColumns)
//   <out>/tensorboard/events.out.tfevents.*   scalars for `tensorboard --logdir <out>`
//                                 (unless turned off): train/loss, eval/loss,
//                                 train/learning_rate, train/grad_norm, train/tokens_per_second,
//                                 train/epoch, memory/peak_device_gib, memory/host_rss_gib,
//                                 memory/gpu_gib (the backend's bytes in use after the step)
//   <out>/loss.png                training (raw, smoothed) and evaluation loss
// The three logs are overwritten once when the log opens, with exactly the history the run
// starts from (a checkpoint's, or none; earlier event files are removed, so TensorBoard never
// shows steps the run went back on), then appended record by record, each flushed, so that
// they always match what the next checkpoint will hold. loss.png is overwritten on each
// refresh_plot from the whole history.
#pragma once
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "report/tensorboard.h"

namespace sf {

// The columns of metrics.csv, in order (a record without a field leaves its cell empty).
extern const std::vector<std::string> kCsvColumns;

// One line of metrics.csv for `record` (no newline).
std::string csv_row(const nlohmann::json& record);
// The TensorBoard scalars of `record` (the tags in metrics_log.h's header).
std::vector<TensorBoardScalar> tensorboard_scalars(const nlohmann::json& record);

enum class TensorBoardLog { on, off };

class MetricsLog {
 public:
  MetricsLog() = default;
  // Rewrites the logs under `out` with `history` and opens them for appending; Error(io)
  // naming the file when it cannot. `plot_title` heads the loss plot.
  MetricsLog(const std::filesystem::path& out, std::vector<nlohmann::json> history,
             std::string plot_title, TensorBoardLog tensorboard);

  // Adds `record` to the history and the files; Error(io) "<file>: write failed (<why>)" when
  // the write does not reach a file (the history keeps the record).
  void append(const nlohmann::json& record);
  // Redraws loss.png; nullopt when it did, else why not (a plot is never worth failing a run).
  std::optional<std::string> refresh_plot() const;

  const std::vector<nlohmann::json>& history() const { return history_; }
  const std::filesystem::path& file() const { return file_; }
  const std::filesystem::path& plot_file() const { return plot_file_; }
  // The event file; empty with TensorBoardLog::off.
  const std::filesystem::path& tensorboard_file() const { return events_.file(); }

 private:
  void open_tensorboard(const std::filesystem::path& dir);

  std::filesystem::path file_, csv_file_, plot_file_;
  std::vector<nlohmann::json> history_;
  std::string plot_title_;
  std::ofstream stream_, csv_;
  TensorBoardWriter events_;
};

}  // namespace sf
