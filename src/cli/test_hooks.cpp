#include "cli/test_hooks.h"

#include <cstdlib>
#include <memory>

#include "backend/threaded_streams_backend.h"
#include "engine/executor_factory.h"

namespace sf::cli {

void install_test_hooks() {
  const char* lazy = std::getenv("SF_TEST_LAZY_STREAMS");
  if (!lazy || std::string_view(lazy) != "1") return;
  set_host_backend_decorator([](std::unique_ptr<Backend> be) -> std::unique_ptr<Backend> {
    ThreadedStreamsBackend::Options o;
    o.lazy = true;
    return std::make_unique<ThreadedStreamsBackend>(std::move(be), o);
  });
}

}  // namespace sf::cli
