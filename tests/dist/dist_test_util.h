// Helpers for the dist tests: run N ranks as threads and collect what each threw; seeded
// inputs whose sums depend on the summation order.
#pragma once
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/nccl_library.h"

namespace sf::dist::test {

// What fn throws (its what()), or "" when it returns.
inline std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// A file's whole contents ("" when it cannot be read).
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The toolkit's NCCL where this machine has it, else null (CI without CUDA skips).
inline std::unique_ptr<NcclLibrary> toolkit_nccl() {
  for (const char* p : {"libnccl.so.2", "/usr/local/cuda/lib64/libnccl.so.2", "/usr/local/cuda/lib/libnccl.so.2"}) {
    try {
      return NcclLibrary::open(p);
    } catch (const Error&) {
    }
  }
  return nullptr;
}

// Runs fn(rank) on `world` threads; returns each rank's exception message ("" if none).
inline std::vector<std::string> run_ranks(int world, const std::function<void(int)>& fn) {
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
        if (errors[static_cast<size_t>(r)].empty()) errors[static_cast<size_t>(r)] = "(empty message)";
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

// Values of random sign with exponents over [-20, 20]: float sums of these round differently
// in different orders, so a reduction in the wrong order changes the bits.
template <class T>
std::vector<T> spread_values(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> mant(0.5, 1.0);
  std::uniform_int_distribution<int> expo(-20, 20);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>((gen() & 1 ? -1.0 : 1.0) * std::ldexp(mant(gen), expo(gen)));
  return v;
}

}  // namespace sf::dist::test
