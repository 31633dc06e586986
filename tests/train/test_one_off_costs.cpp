// The run's last lines name what the backend paid once (Backend::one_off_costs: on CUDA the
// time cuDNN took to build its attention plans): a host backend wrapped through the decorator
// hook reports a cost, and the trainer prints it after the done line; the plain host backend
// reports none, and no such line appears.
#include <gtest/gtest.h>

#include <memory>
#include <sstream>
#include <string>

#include "backend/forwarding_backend.h"
#include "engine/executor_factory.h"
#include "train_test_util.h"

namespace sf::test {
namespace {

class CostlyBackend final : public PassThroughBackend {
 public:
  explicit CostlyBackend(std::unique_ptr<Backend> inner)
      : PassThroughBackend(*inner), owned_(std::move(inner)) {}
  std::string one_off_costs() const override { return "built 3 kernels in 0.7 s"; }

 private:
  std::unique_ptr<Backend> owned_;
};

struct DecoratorScope {
  DecoratorScope() {
    set_host_backend_decorator([](std::unique_ptr<Backend> be) -> std::unique_ptr<Backend> {
      return std::make_unique<CostlyBackend>(std::move(be));
    });
  }
  ~DecoratorScope() { set_host_backend_decorator(nullptr); }
};

std::string train_log(const fs::path& dir) {
  const fs::path model = make_tiny_model(dir / "model");
  const fs::path tokens = make_tokens(dir / "tokens.bin", 400);
  TrainOptions o = tiny_run(model, tokens, dir / "out");
  o.steps = 2;
  o.eval_every = 0;
  o.progress = TrainOptions::Progress::lines;
  std::ostringstream log;
  run_training(o, log);
  return log.str();
}

TEST(OneOffCosts, TheRunsLastLineNamesWhatTheBackendPaidOnce) {
  TempDir tmp("sf-one-off");
  std::string log;
  {
    DecoratorScope scope;
    log = train_log(tmp.path / "costly");
  }
  const size_t done = log.find("\ndone: 2 steps");
  ASSERT_NE(done, std::string::npos) << log;
  EXPECT_NE(log.find("\none-off: built 3 kernels in 0.7 s\n", done), std::string::npos) << log;

  EXPECT_EQ(train_log(tmp.path / "plain").find("one-off:"), std::string::npos)
      << "the host backend has no one-off cost to name";
}

}  // namespace
}  // namespace sf::test
