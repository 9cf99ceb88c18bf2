// SPDX-License-Identifier: Apache-2.0
// Cli over CLI11: option declaration, fio/ds_io names, "did you mean", and the one help
// format every command prints. The value grammar (sizes, counts, durations) is value_grammar.cc.
#include "args.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include "zinf/common/error.h"
#include "zinf/common/suggest.h"

namespace zinf::tools {

namespace {

// How another tool's option is taken here.
struct Alias {
  std::string to;  // rename: the zinf option, value and all
  std::function<std::vector<std::string>(const std::string&)> map;  // or map the value
  std::string refusal;                                              // or refuse, naming ours
  std::vector<std::string> switch_tokens;  // or, for a switch, these tokens
};

// fio's and DeepSpeed ds_io's names for what zinf also has: used wherever the command has the
// target option. (ds_io's snake_case names, --block_size and --queue_depth, are read with
// '_' as '-', for every option.)
const std::pair<const char*, const char*> kForeignNames[] = {
    {"--bs", "--block-size"},   {"--iodepth", "--queue-depth"}, {"--runtime", "--duration"},
    {"--directory", "--dir"},   {"--folder", "--dir"},          {"--io_size", "--size"},
    {"--ioengine", "--engine"},
};

// The names above and fio's --rw and --numjobs, for the error when this command lacks them.
bool is_foreign_name(std::string_view name) {
  if (name == "--rw" || name == "--numjobs" || name == "--read") return true;
  return std::any_of(std::begin(kForeignNames), std::end(kForeignNames),
                     [&](const auto& p) { return name == p.first; });
}

// One help format for every command: "  --name VALUE   text [default: X]", the text's own
// lines indented under it; groups under their title; switches carry no default (off).
class HelpFormat : public CLI::Formatter {
 public:
  std::string make_help(const CLI::App* app, std::string, CLI::AppFormatMode) const override {
    std::ostringstream out;
    out << "usage: " << app->get_name() << " [options]\n";
    if (!app->get_description().empty()) out << '\n' << app->get_description() << '\n';
    // The help switch is in no group (CLI11 would give it one of its own): it closes the
    // last one instead.
    std::vector<std::string> groups;
    for (const CLI::Option* o : app->get_options()) {
      if (!o->get_group().empty() &&
          std::find(groups.begin(), groups.end(), o->get_group()) == groups.end()) {
        groups.push_back(o->get_group());
      }
    }
    if (groups.empty()) groups.push_back("options");
    out << "\nA value's default is in [brackets]; a switch is off unless given.\n";
    for (std::size_t i = 0; i < groups.size(); ++i) {
      out << '\n' << groups[i] << ":\n";
      for (const CLI::Option* o : app->get_options()) {
        if (o->get_group() == groups[i]) out << line(o);
      }
      if (i + 1 == groups.size() && app->get_help_ptr() != nullptr) {
        out << line(app->get_help_ptr());
      }
    }
    out << value_kinds(app);
    if (!app->get_footer().empty()) out << '\n' << app->get_footer() << '\n';
    return out.str();
  }

 private:
  static constexpr std::size_t kColumn = 26;

  // The grammar of each kind of value this command takes, once (args.h has the whole of it).
  static std::string value_kinds(const CLI::App* app) {
    static constexpr std::pair<const char*, const char*> kKinds[] = {
        {"SIZE",
         "bytes: 4096, 4K, 1.5M, 2GiB, 64mb; K/M/G/T and KiB/MiB/GiB/TiB = 1024^n,\n"
         "      kB/MB/GB/TB = 1000^n, any case"},
        {"N", "a count: 16, 1e8, or with K/M/G/T = 1024^n (20M = 20 x 2^20)"},
        {"TIME", "a duration: 250ms, 10s, 5m, 1h, any case; a bare number is seconds"},
    };
    std::string out;
    for (const auto& [kind, text] : kKinds) {
      for (const CLI::Option* o : app->get_options()) {
        if (o->get_type_name() == kind) {
          out += std::string(out.empty() ? "\n" : "") + kind + ": " + text + "\n";
          break;
        }
      }
    }
    return out;
  }

  static constexpr std::size_t kWidth = 100;  // the help fits the terminals the docs assume

  // "  --name VALUE" in the left column, the description word-wrapped in the right one, the
  // default last.
  static std::string line(const CLI::Option* o) {
    std::string left = "  ";
    for (const std::string& s : o->get_snames()) left += "-" + s + ", ";
    for (const std::string& l : o->get_lnames()) left += "--" + l + ", ";
    left.resize(left.size() - 2);
    if (!o->get_type_name().empty()) left += " " + o->get_type_name();
    std::vector<std::string> lines;  // the description, word-wrapped
    std::istringstream words(o->get_description());
    std::string cur;
    for (std::string w; words >> w;) {
      if (!cur.empty() && kColumn + cur.size() + 1 + w.size() > kWidth) {
        lines.push_back(cur);
        cur.clear();
      }
      cur += (cur.empty() ? "" : " ") + w;
    }
    if (!cur.empty()) lines.push_back(cur);
    if (!o->get_default_str().empty()) {
      const std::string d = "[" + o->get_default_str() + "]";
      if (lines.empty() || kColumn + lines.back().size() + 1 + d.size() > kWidth) {
        lines.push_back(d);
      } else {
        lines.back() += " " + d;
      }
    }
    std::string out = left;
    if (left.size() + 2 > kColumn) {
      out += "\n" + std::string(kColumn, ' ');
    } else {
      out += std::string(kColumn - left.size(), ' ');
    }
    for (std::size_t i = 0; i < lines.size(); ++i) {
      if (i) out += "\n" + std::string(kColumn, ' ');
      out += lines[i];
    }
    return out + "\n";
  }
};

// Help texts are raw strings that start on the line after R"( for the 100 columns: that first
// newline is not part of the text.
std::string trim_newline(std::string s) {
  if (!s.empty() && s.front() == '\n') s.erase(0, 1);
  return s;
}

}  // namespace

struct Cli::Impl {
  std::string command;
  CLI::App app;
  std::string group = "options";
  std::vector<std::string> names;  // every option declared, "--name"
  std::map<std::string, Alias> aliases;
  bool help_asked = false;

  Impl(std::string cmd, std::string about, std::string footer)
      : command(std::move(cmd)), app(trim_newline(std::move(about)), "zinf " + command) {
    app.footer(trim_newline(std::move(footer)));
    app.formatter(std::make_shared<HelpFormat>());
    // The last of a repeated option wins, as in most tools; texts() keep every one.
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    // Unknown tokens come back to us, for "did you mean" rather than CLI11's own message.
    app.allow_extras(true);
    app.set_help_flag("-h,--help", "print this help and exit")->group("");
  }

  bool has(std::string_view name) const {
    return std::find(names.begin(), names.end(), name) != names.end();
  }

  CLI::Option* declare(CLI::Option* o, const std::string& name, std::string value_name,
                       std::string shown) {
    names.push_back(name);
    o->type_name(std::move(value_name));
    o->default_str(std::move(shown));
    o->group(group);
    return o;
  }

  template <typename Convert>
  void value(const std::string& name, std::string value_name, std::string help, std::string shown,
             Convert convert) {
    CLI::Option* o = app.add_option_function<std::string>(
        name, [name, convert](const std::string& v) { convert(v, name); }, std::move(help));
    declare(o, name, std::move(value_name), std::move(shown));
  }

  std::vector<std::string> translate(const std::vector<std::string>& tokens) const;
  [[noreturn]] void unknown(const std::string& token) const;
};

// Rewrites other tools' names into zinf's before CLI11 sees them: "--bs=4K" -> "--block-size=4K",
// "--queue_depth" -> "--queue-depth", "--rw read" -> "--op=read"; refuses what has no match.
std::vector<std::string> Cli::Impl::translate(const std::vector<std::string>& tokens) const {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::string& tok = tokens[i];
    if (tok.rfind("--", 0) != 0 || tok.size() == 2) {
      out.push_back(tok);
      continue;
    }
    const std::size_t eq = tok.find('=');
    std::string name = tok.substr(0, eq);
    const std::string rest = eq == std::string::npos ? "" : tok.substr(eq);
    if (has(name)) {
      out.push_back(tok);
      continue;
    }
    if (const auto a = aliases.find(name); a != aliases.end()) {
      const Alias& alias = a->second;
      if (!alias.refusal.empty()) throw UsageError(alias.refusal);
      if (!alias.switch_tokens.empty()) {
        out.insert(out.end(), alias.switch_tokens.begin(), alias.switch_tokens.end());
        continue;
      }
      if (alias.map) {
        std::string v;
        if (eq != std::string::npos) {
          v = tok.substr(eq + 1);
        } else if (i + 1 < tokens.size()) {
          v = tokens[++i];
        } else {
          throw UsageError("option " + name + " needs a value");
        }
        for (std::string& t : alias.map(v)) out.push_back(std::move(t));
        continue;
      }
      if (has(alias.to)) {
        out.push_back(alias.to + rest);
        continue;
      }
    }
    std::string dashed = name;
    std::replace(dashed.begin() + 2, dashed.end(), '_', '-');
    if (dashed != name && has(dashed)) {
      out.push_back(dashed + rest);
      continue;
    }
    if (is_foreign_name(name)) {
      throw UsageError(name + " (fio's or ds_io's name) has no counterpart in 'zinf " + command +
                       "'; its options are listed by 'zinf " + command + " --help'");
    }
    out.push_back(tok);
  }
  return out;
}

void Cli::Impl::unknown(const std::string& token) const {
  const std::string name = token.substr(0, token.find('='));
  std::string msg = "unknown option '" + name + "' for '" + command + "'";
  // A typo is at most 2 edits, or one per 3 characters of what was typed.
  std::string_view s = closest_match(name, names, typo_distance(name, 3));
  if (s.empty()) {
    // A near miss of another tool's name suggests the zinf option that name maps to.
    std::vector<std::string> foreign;
    for (const auto& [from, a] : aliases) {
      if (!a.to.empty() && has(a.to)) foreign.push_back(from);
    }
    const std::string_view f = closest_match(name, foreign, typo_distance(name, 3));
    if (!f.empty()) s = aliases.at(std::string(f)).to;
  }
  if (!s.empty()) msg += " (did you mean " + std::string(s) + "?)";
  throw UsageError(msg);
}

Cli::Cli(std::string command, std::string about, std::string footer)
    : impl_(std::make_unique<Impl>(std::move(command), std::move(about), std::move(footer))) {
  for (const auto& [from, to] : kForeignNames) impl_->aliases[from].to = to;
}

Cli::~Cli() = default;

Cli& Cli::group(std::string title) {
  impl_->group = std::move(title);
  return *this;
}

namespace {

// `--save ''` (a script's unset variable) must not read as "no value given": the run would
// train without saving and exit 0.
void refuse_empty(const std::string& value, const std::string& name) {
  if (value.empty()) {
    throw UsageError("invalid " + name + " '': the value is empty (an unset variable?); give " +
                     "a value or leave the option out");
  }
}

}  // namespace

Cli& Cli::text(const std::string& name, std::string& dest, std::string value_name, std::string help,
               std::string shown) {
  if (shown.empty()) shown = dest.empty() ? "none" : dest;
  impl_->value(name, std::move(value_name), std::move(help), std::move(shown),
               [&dest](const std::string& v, const std::string& n) {
                 refuse_empty(v, n);
                 dest = v;
               });
  return *this;
}

Cli& Cli::texts(const std::string& name, std::vector<std::string>& dest, std::string value_name,
                std::string help, std::string shown) {
  // One value per occurrence: `--dir a b` leaves b unknown instead of taking it as a second dir.
  CLI::Option* o = impl_->app.add_option(name, dest, std::move(help));
  o->expected(1)->allow_extra_args(false)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  o->each([name](const std::string& v) { refuse_empty(v, name); });
  impl_->declare(o, name, std::move(value_name), std::move(shown));
  return *this;
}

Cli& Cli::choice(const std::string& name, std::string& dest, std::vector<std::string> choices,
                 std::string value_name, std::string help, std::string shown) {
  if (shown.empty()) shown = dest.empty() ? "none" : dest;
  impl_->value(name, std::move(value_name), std::move(help), std::move(shown),
               [&dest, choices = std::move(choices)](const std::string& v, const std::string& n) {
                 dest = parse_choice(v, n, choices);
               });
  return *this;
}

Cli& Cli::size(const std::string& name, std::uint64_t& dest, std::string help, std::string shown) {
  if (shown.empty()) shown = size_text(dest);
  impl_->value(name, "SIZE", std::move(help), std::move(shown),
               [&dest](const std::string& v, const std::string& n) { dest = parse_size(v, n); });
  return *this;
}

Cli& Cli::size(const std::string& name, std::optional<std::uint64_t>& dest, std::string help,
               std::string shown) {
  impl_->value(name, "SIZE", std::move(help), std::move(shown),
               [&dest](const std::string& v, const std::string& n) { dest = parse_size(v, n); });
  return *this;
}

Cli& Cli::count(const std::string& name, std::uint64_t& dest, std::string help, std::uint64_t min,
                std::uint64_t max, std::string shown) {
  if (shown.empty()) shown = std::to_string(dest);
  impl_->value(name, "N", std::move(help), std::move(shown),
               [&dest, min, max](const std::string& v, const std::string& n) {
                 dest = parse_count(v, n, min, max);
               });
  return *this;
}

Cli& Cli::number(const std::string& name, double& dest, std::string help, std::string shown) {
  if (shown.empty()) {
    std::ostringstream s;
    s << dest;
    shown = s.str();
  }
  impl_->value(name, "X", std::move(help), std::move(shown),
               [&dest](const std::string& v, const std::string& n) { dest = parse_number(v, n); });
  return *this;
}

Cli& Cli::duration(const std::string& name, std::chrono::milliseconds& dest, std::string help,
                   std::string shown) {
  if (shown.empty()) shown = duration_text(dest);
  impl_->value(
      name, "TIME", std::move(help), std::move(shown),
      [&dest](const std::string& v, const std::string& n) { dest = parse_duration(v, n); });
  return *this;
}

Cli& Cli::flag(const std::string& name, bool& dest, std::string help) {
  CLI::Option* o = impl_->app.add_flag(name, dest, std::move(help));
  impl_->declare(o, name, "", "");
  return *this;
}

Cli& Cli::hidden_flag(const std::string& name, bool& dest) {
  CLI::Option* o = impl_->app.add_flag(name, dest, "");
  impl_->declare(o, name, "", "");
  o->group("");  // CLI11's mark of an option left out of the help
  return *this;
}

Cli& Cli::alias(const std::string& from, const std::string& to) {
  impl_->aliases[from] = Alias{to, {}, "", {}};
  return *this;
}

Cli& Cli::alias_value(const std::string& from,
                      std::function<std::vector<std::string>(const std::string&)> map) {
  impl_->aliases[from] = Alias{"", std::move(map), "", {}};
  return *this;
}

Cli& Cli::refuse(const std::string& from, std::string why) {
  impl_->aliases[from] = Alias{"", {}, std::move(why), {}};
  return *this;
}

Cli& Cli::alias_switch(const std::string& from, std::vector<std::string> tokens) {
  impl_->aliases[from] = Alias{"", {}, "", std::move(tokens)};
  return *this;
}

bool Cli::parse(const std::vector<std::string>& tokens) {
  // --help wins over everything else on the line, mistakes included: it is what a user
  // reaches for when the line does not work.
  for (const std::string& t : tokens) {
    if (t == "--help" || t == "-h") {
      std::fputs(help().c_str(), stdout);
      return false;
    }
  }
  std::vector<std::string> args = impl_->translate(tokens);
  // CLI11 takes the arguments last-first.
  std::reverse(args.begin(), args.end());
  try {
    impl_->app.parse(args);
  } catch (const CLI::ArgumentMismatch& e) {
    // "--size: 1 required SIZE missing": the option before the colon lacks its value.
    const std::string what = e.what();
    throw UsageError("option " + what.substr(0, what.find(':')) + " needs a value");
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
  const std::vector<std::string> extra = impl_->app.remaining();
  if (!extra.empty()) impl_->unknown(extra.front());
  return true;
}

std::string Cli::help() const { return impl_->app.help(); }

}  // namespace zinf::tools
