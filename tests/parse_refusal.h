// For the tests of a file-format parser (View::parse(bytes, size, source) throwing
// Error(input) on a malformed image): what it says, and the expectation that it refuses.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace sf::test {

// The message of the Error(input) View::parse throws for `b`, or "" when it accepts it.
template <class View>
std::string parse_error_of(const std::vector<uint8_t>& b, const std::string& src) {
  try {
    View::parse(b.data(), b.size(), src);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::input) << e.what();
    return e.what();
  }
  return "";
}

// Expects `b` to be refused with a message naming `src` and containing `needle`.
template <class View>
void expect_parse_refused(const std::vector<uint8_t>& b, const std::string& src,
                          const std::string& needle) {
  std::string msg = parse_error_of<View>(b, src);
  ASSERT_FALSE(msg.empty()) << "accepted; expected an error containing: " << needle;
  EXPECT_NE(msg.find(src), std::string::npos) << msg;
  EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg;
}

}  // namespace sf::test
