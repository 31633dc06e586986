// Command-line errors in the house style: CLI11's own parse errors (unknown flag, missing or
// unconvertible value, missing required option, unknown command) rewritten to say what was
// wrong and how to fix it, with a "did you mean --xyz?" for a mistyped flag or command, and
// one exit status for every user error (kUserErrorExit, the status of an sf::Error).
#pragma once
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

namespace sf::cli {

constexpr int kUserErrorExit = 2;  // a user error: bad flag, bad value, bad input file

// Optimal string alignment distance: insertions, deletions, substitutions and swaps of two
// neighbours each cost one.
size_t edit_distance(std::string_view a, std::string_view b);
// The candidate a typo of `word` most likely meant: the nearest by edit distance when it is
// within a third of the word's length (at least 1), else the one `word` is a prefix of (3
// characters or more); "" when none.
std::string closest_name(const std::string& word, const std::vector<std::string>& candidates);

// What a value of option `o` looks like, for messages: ("a whole number", "8") and the like
// (a number, a whole number 0 or more, a valid value), with the option's default as the
// example where it has one.
std::pair<std::string, std::string> value_kind_and_example(const CLI::Option* o);

// Writes the message for `e` to `err` ("slideformer: error: ..."; the help text for --help)
// and returns the exit status: 0 for --help, the requested status for CLI::RuntimeError (the
// signal exits), kUserErrorExit for everything else. `args`: the command line without argv[0]
// (to name the first unknown argument in the order the user wrote them).
int report_parse_error(CLI::App& app, const CLI::ParseError& e,
                       const std::vector<std::string>& args, std::ostream& err);

}  // namespace sf::cli
