// CLI11's parse errors in the house style (cli/cli_errors.h). The message is built from the
// command's own option table (names, descriptions, types, defaults), so a new flag needs no
// entry here.
#include "cli/cli_errors.h"

#include <algorithm>
#include <cctype>
#include <set>

namespace sf::cli {

size_t edit_distance(std::string_view a, std::string_view b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i)
    for (size_t j = 1; j <= m; ++j) {
      const size_t sub = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + sub});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

std::string closest_name(const std::string& word, const std::vector<std::string>& candidates) {
  auto bare = [](const std::string& s) {
    const size_t i = s.find_first_not_of('-');
    return i == std::string::npos ? std::string() : s.substr(i);
  };
  const std::string w = bare(word);
  if (w.empty()) return "";
  const size_t limit = std::max<size_t>(1, w.size() / 3);
  std::string best;
  size_t best_d = limit + 1;
  for (const std::string& c : candidates) {
    const size_t dist = edit_distance(w, bare(c));
    if (dist < best_d) best_d = dist, best = c;
  }
  if (!best.empty()) return best;
  if (w.size() >= 3)
    for (const std::string& c : candidates)
      if (bare(c).rfind(w, 0) == 0) return c;
  return "";
}

namespace {

std::vector<std::string> long_flags(const CLI::App& cmd) {
  std::vector<std::string> v;
  for (const CLI::Option* o : cmd.get_options())
    for (const std::string& n : o->get_lnames()) v.push_back("--" + n);
  return v;
}

std::string flag_name(const CLI::Option* o) {
  return o->get_lnames().empty() ? o->get_name() : "--" + o->get_lnames().front();
}

// The option of `cmd` whose long name appears in `text` as a whole word (the longest such).
const CLI::Option* option_named_in(const CLI::App& cmd, const std::string& text) {
  const CLI::Option* best = nullptr;
  size_t best_len = 0;
  auto name_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'; };
  for (const CLI::Option* o : cmd.get_options())
    for (const std::string& n : o->get_lnames()) {
      const std::string f = "--" + n;
      for (size_t p = text.find(f); p != std::string::npos; p = text.find(f, p + 1)) {
        const size_t end = p + f.size();
        if ((end < text.size() && name_char(text[end])) || (p > 0 && name_char(text[p - 1]))) continue;
        if (f.size() > best_len) best = o, best_len = f.size();
        break;
      }
    }
  return best;
}

std::string commands_list(CLI::App& app) {
  std::string s;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    s += (s.empty() ? "" : ", ") + sub->get_name();
  return s;
}

}  // namespace

std::pair<std::string, std::string> value_kind_and_example(const CLI::Option* o) {
  const std::string t = o->get_type_name();
  std::string kind = "a valid value", example = "VALUE";
  if (t == "INT") kind = "a whole number", example = "8";
  else if (t == "UINT") kind = "a whole number 0 or more", example = "1234";
  else if (t == "FLOAT") kind = "a number", example = "0.5";
  std::string d = o->get_default_str();
  if (!d.empty() && d != "\"\"" && t != "TEXT") example = d;
  return {kind, example};
}

namespace {

std::string joined_results(const CLI::Option* o) {
  std::string v;
  for (const std::string& r : o->results()) v += (v.empty() ? "" : " ") + r;
  return v;
}

// The first argument of `args` that CLI11 left over in `left` (in the user's order).
std::string first_left_over(const std::vector<std::string>& left, const std::vector<std::string>& args,
                            bool flags) {
  std::multiset<std::string> pool(left.begin(), left.end());
  for (const std::string& a : args) {
    if (pool.count(a) == 0 || (a.rfind("-", 0) == 0) != flags) continue;
    return a;
  }
  for (const std::string& a : left)
    if ((a.rfind("-", 0) == 0) == flags) return a;
  return "";
}

std::string unknown_argument(CLI::App& app, CLI::App* cmd, const std::vector<std::string>& left,
                             const std::vector<std::string>& args) {
  const std::string where = cmd ? "`slideformer " + cmd->get_name() + "`" : "`slideformer`";
  const std::string help = cmd ? "`slideformer " + cmd->get_name() + " --help` lists the options"
                               : "`slideformer --help` lists the commands";
  std::string flag = first_left_over(left, args, true);
  if (!flag.empty()) {
    if (size_t eq = flag.find('='); eq != std::string::npos) flag.resize(eq);
    const std::string near = closest_name(flag, long_flags(cmd ? *cmd : app));
    return "unknown option " + flag + " for " + where +
           (near.empty() ? "; " + help : "; did you mean " + near + "? (" + help + ")");
  }
  const std::string word = first_left_over(left, args, false);
  if (!cmd) {
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
      names.push_back(sub->get_name());
    const std::string near = closest_name(word, names);
    return "unknown command \"" + word + "\"" +
           (near.empty() ? "" : "; did you mean " + near + "?") + " The commands: " +
           commands_list(app) + " (" + help + ")";
  }
  return "unexpected argument \"" + word + "\" for " + where +
         ": every value follows its flag (e.g. --out DIR); " + help;
}

}  // namespace

int report_parse_error(CLI::App& app, const CLI::ParseError& e,
                       const std::vector<std::string>& args, std::ostream& err) {
  if (dynamic_cast<const CLI::Success*>(&e)) return app.exit(e);         // --help
  if (dynamic_cast<const CLI::RuntimeError*>(&e)) return e.get_exit_code();  // signal exits
  std::vector<CLI::App*> parsed = app.get_subcommands();
  CLI::App* cmd = parsed.empty() ? nullptr : parsed.front();
  const CLI::App& scope = cmd ? *cmd : app;
  const std::string help = cmd ? "`slideformer " + cmd->get_name() + " --help` lists the options"
                               : "`slideformer --help` lists the commands";
  const std::string what = e.what();
  const CLI::Option* opt = option_named_in(scope, what);
  if (!opt && cmd) opt = option_named_in(app, what);
  std::string msg;
  if (dynamic_cast<const CLI::ExtrasError*>(&e)) {
    std::vector<std::string> left = scope.remaining();
    if (left.empty()) left = app.remaining(true);
    msg = unknown_argument(app, cmd, left, args);
  } else if (dynamic_cast<const CLI::RequiredError*>(&e)) {
    if (!cmd) {
      std::vector<std::string> left = app.remaining();
      msg = left.empty() ? "no command given; use one of: " + commands_list(app) + " (" + help + ")"
                         : unknown_argument(app, nullptr, left, args);
    } else {
      const CLI::Option* missing = nullptr;
      for (const CLI::Option* o : cmd->get_options())
        if (o->get_required() && o->count() == 0) {
          missing = o;
          break;
        }
      if (!missing) missing = opt;
      msg = missing ? "`slideformer " + cmd->get_name() + "` needs " + flag_name(missing) + " (" +
                          missing->get_description() + "); " + help
                    : what + "; " + help;
    }
  } else if (dynamic_cast<const CLI::ConversionError*>(&e) && opt) {
    auto [kind, example] = value_kind_and_example(opt);
    std::string v = joined_results(opt);
    if (v.empty() && what.find(" = ") != std::string::npos) v = what.substr(what.find(" = ") + 3);
    msg = flag_name(opt) + " \"" + v + "\" is not " + kind + "; pass e.g. " + flag_name(opt) +
          " " + example + " (" + opt->get_description() + ")";
  } else if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) && opt) {
    auto [kind, example] = value_kind_and_example(opt);
    msg = flag_name(opt) + " needs a value (" + opt->get_description() + "); pass e.g. " +
          flag_name(opt) + " " + example;
  } else if (dynamic_cast<const CLI::ValidationError*>(&e) && opt) {
    // Our validators' messages say what a good value is; CLI11 puts "--name: " before them.
    std::string why = what;
    if (size_t c = why.find(": "); c != std::string::npos) why = why.substr(c + 2);
    msg = flag_name(opt) + " " + joined_results(opt) + ": " + why;
  } else {
    msg = what + "; " + help;
  }
  err << "slideformer: error: " << msg << "\n";
  return kUserErrorExit;
}

}  // namespace sf::cli
