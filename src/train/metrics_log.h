// A run's metrics: <out>/metrics.jsonl (one JSON object per line: a step's record, or the
// evaluation before the first step) and the loss plot <out>/loss.png drawn from it.
// metrics.jsonl is overwritten once when the log opens, with exactly the history the run
// starts from (a checkpoint's, or none), then appended record by record, each flushed, so
// that it always matches what the next checkpoint will hold. loss.png is overwritten on each
// refresh_plot from the whole history.
#pragma once
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sf {

class MetricsLog {
 public:
  MetricsLog() = default;
  // Rewrites <out>/metrics.jsonl with `history` and opens it for appending; Error(io) naming
  // the file when it cannot. `plot_title` heads the loss plot.
  MetricsLog(const std::filesystem::path& out, std::vector<nlohmann::json> history,
             std::string plot_title);

  // Adds `record` to the history and the file; Error(io) "<file>: write failed (<why>)" when
  // the write does not reach the file (the history keeps the record).
  void append(const nlohmann::json& record);
  // Redraws loss.png; nullopt when it did, else why not (a plot is never worth failing a run).
  std::optional<std::string> refresh_plot() const;

  const std::vector<nlohmann::json>& history() const { return history_; }
  const std::filesystem::path& file() const { return file_; }
  const std::filesystem::path& plot_file() const { return plot_file_; }

 private:
  std::filesystem::path file_, plot_file_;
  std::vector<nlohmann::json> history_;
  std::string plot_title_;
  std::ofstream stream_;
};

}  // namespace sf
