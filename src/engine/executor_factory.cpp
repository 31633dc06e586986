#include "engine/executor_factory.h"

#include "backend/host/host_backend.h"
#include "core/error.h"
#include "engine/resident_executor.h"

namespace sf {

namespace {

// Keeps the backend alive as long as the executor that uses it.
class OwningExecutor final : public StepExecutor {
 public:
  OwningExecutor(std::unique_ptr<Backend> be, const ModelConfig& cfg, int64_t micro_tokens)
      : be_(std::move(be)), exec_(*be_, cfg, micro_tokens) {}
  StepStats train_step(std::span<const Batch> m, const OptimHyper& h) override {
    return exec_.train_step(m, h);
  }
  double eval_loss_sum(const Batch& b) override { return exec_.eval_loss_sum(b); }
  ParamStore& params() override { return exec_.params(); }
  void params_changed() override { exec_.params_changed(); }
  const char* name() const override { return exec_.name(); }

 private:
  std::unique_ptr<Backend> be_;
  ResidentExecutor exec_;
};

}  // namespace

std::unique_ptr<StepExecutor> make_executor(const std::string& backend, const ModelConfig& cfg,
                                            const ModelLayout& layout, int64_t micro_tokens) {
  (void)layout;
  if (backend == "host" || backend == "auto")
    return std::make_unique<OwningExecutor>(std::make_unique<HostBackend>(), cfg, micro_tokens);
  if (backend == "cuda")
    SF_FAIL(input, "--backend cuda: this build has no CUDA backend yet; use --backend host");
  SF_FAIL(input, "--backend \"", backend, "\" is unknown; use auto, host or cuda");
}

}  // namespace sf
