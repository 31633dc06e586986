// Typed errors and check macros. Library code never calls exit(): it throws one of these,
// and the message names the file/field/layer involved and how to fix it.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace sf {

enum class ErrorKind { input, io, out_of_memory, cuda, internal };

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& msg) : std::runtime_error(msg), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// Concatenate anything streamable into one string.
template <class... A>
std::string cat(const A&... a) {
  std::ostringstream os;
  (os << ... << a);
  return os.str();
}

namespace detail {
[[noreturn]] void throw_error(ErrorKind kind, const char* expr, const char* file, int line,
                              const std::string& msg);
}  // namespace detail

}  // namespace sf

// SF_CHECK: an internal invariant (a bug if it fails); records statement, file and line.
#define SF_CHECK(cond, ...)                                                                \
  do {                                                                                     \
    if (!(cond))                                                                           \
      ::sf::detail::throw_error(::sf::ErrorKind::internal, #cond, __FILE__, __LINE__,      \
                                ::sf::cat(__VA_ARGS__));                                   \
  } while (0)

// SF_REQUIRE: a user-facing condition (bad file, bad flag). The message is the whole story.
#define SF_REQUIRE(cond, ...)                                                              \
  do {                                                                                     \
    if (!(cond)) throw ::sf::Error(::sf::ErrorKind::input, ::sf::cat(__VA_ARGS__));        \
  } while (0)

#define SF_FAIL(kind, ...) throw ::sf::Error(::sf::ErrorKind::kind, ::sf::cat(__VA_ARGS__))
