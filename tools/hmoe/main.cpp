// hmoe: dispatch to a subcommand. Errors become one line on stderr and exit 1.
#include <cstdio>
#include <iostream>
#include <map>

#include "configs/error.h"
#include "tools/hmoe/command.h"

namespace hmoe::cli {

static std::vector<Command>& registry() {
  static std::vector<Command> r;
  return r;
}
void register_command(const Command& c) { registry().push_back(c); }
const std::vector<Command>& commands() { return registry(); }

bool take_flag(std::vector<std::string>& args, const std::string& name) {
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i] == name) {
      args.erase(args.begin() + static_cast<std::ptrdiff_t>(i));
      return true;
    }
  return false;
}

bool take_option(std::vector<std::string>& args, const std::string& name, std::string& value) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == name) {
      if (i + 1 >= args.size()) fail(ErrorKind::invalid_argument, name + ": missing value");
      value = args[i + 1];
      args.erase(args.begin() + static_cast<std::ptrdiff_t>(i), args.begin() + static_cast<std::ptrdiff_t>(i) + 2);
      return true;
    }
    if (args[i].rfind(name + "=", 0) == 0) {
      value = args[i].substr(name.size() + 1);
      args.erase(args.begin() + static_cast<std::ptrdiff_t>(i));
      return true;
    }
  }
  return false;
}

void reject_unknown_flags(const std::vector<std::string>& args, const char* command) {
  for (const auto& a : args)
    if (a.size() > 1 && a[0] == '-' && !(a.size() > 1 && std::isdigit(static_cast<unsigned char>(a[1]))))
      fail(ErrorKind::invalid_argument, std::string("unknown option '") + a + "' for 'hmoe " + command + "' (see hmoe --help)");
}

std::vector<int64_t> parse_id_list(const std::string& flag, const std::string& s) {
  std::vector<int64_t> ids;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (item.empty()) fail(ErrorKind::invalid_argument, flag + ": empty element in '" + s + "'");
    ids.push_back(parse_int(flag + " element", item));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return ids;
}

static void print_help() {
  std::printf("hmoe %s - Mixture-of-Experts inference on GPUs and CPUs\n\nusage: hmoe COMMAND [ARGS] [SETTINGS]\n\ncommands:\n", "0.1.0");
  std::map<std::string, const Command*> sorted;
  for (const auto& c : commands()) sorted[c.name] = &c;
  for (const auto& [n, c] : sorted) std::printf("  %-14s %s\n      hmoe %s\n", n.c_str(), c->summary, c->usage);
  std::printf("\nsettings (flag, environment variable; flags win):\n%s", settings_help().c_str());
}

}  // namespace hmoe::cli

int main(int argc, char** argv) {
  using namespace hmoe;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    cli::print_help();
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version") {
    std::printf("hmoe 0.1.0\n");
    return 0;
  }
  std::string name = args[0];
  args.erase(args.begin());
  for (const auto& c : cli::commands()) {
    if (name != c.name) continue;
    if (cli::take_flag(args, "--help") || cli::take_flag(args, "-h")) {
      std::printf("usage: hmoe %s\n%s\n\nsettings:\n%s", c.usage, c.summary, settings_help().c_str());
      return 0;
    }
    try {
      Settings s = Settings::load(args);
      for (const auto& w : s.warnings) std::fprintf(stderr, "hmoe: %s\n", w.c_str());
      return c.run(s, args);
    } catch (const Error& e) {
      std::fprintf(stderr, "hmoe %s: error: %s\n", name.c_str(), e.what());
      return 1;
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "hmoe %s: error: out of memory\n", name.c_str());
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "hmoe %s: error: %s\n", name.c_str(), e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "hmoe: unknown command '%s' (see hmoe --help)\n", name.c_str());
  return 2;
}
