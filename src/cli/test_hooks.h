// The binary's test hooks, read from the environment once at start-up; harmless when unset.
//   SF_TEST_LAZY_STREAMS=1  the host backend's streams run lazily on their own threads
//                           (backend/threaded_streams_backend.h), so that the CLI tests check
//                           the engine's and the trainer's stream ordering end to end.
//   SF_TEST_FAULT=...       faults at the trainer's hook points (train_command.cpp).
#pragma once

namespace sf::cli {

void install_test_hooks();

}  // namespace sf::cli
