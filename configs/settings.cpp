// Parsing of the settings table. getenv appears in this file only.
#include "configs/settings.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "configs/error.h"

namespace hmoe {

namespace {

// The checks of settings.inc, one entry each (see there).
struct SettingCheck {
  enum class Kind { range, choices, pow2, auto_or_count } kind;
  const char* field;
  double lo = 0, hi = 0;
  const char* choices = "";
};

const std::vector<SettingCheck>& setting_checks() {
  static const std::vector<SettingCheck> t = {
#define HMOE_SETTING_CHECKS
#define HMOE_SETTING(field, kind, def, flag, env, help)
#define HMOE_SETTING_RANGE(field, lo, hi) {SettingCheck::Kind::range, #field, static_cast<double>(lo), static_cast<double>(hi)},
#define HMOE_SETTING_CHOICES(field, words) {SettingCheck::Kind::choices, #field, 0, 0, words},
#define HMOE_SETTING_POW2(field) {SettingCheck::Kind::pow2, #field},
#define HMOE_SETTING_AUTO_OR_COUNT(field) {SettingCheck::Kind::auto_or_count, #field},
#include "configs/settings.inc"
#undef HMOE_SETTING_AUTO_OR_COUNT
#undef HMOE_SETTING_POW2
#undef HMOE_SETTING_CHOICES
#undef HMOE_SETTING_RANGE
#undef HMOE_SETTING
#undef HMOE_SETTING_CHECKS
  };
  return t;
}

std::vector<std::string> split_words(const std::string& s) {
  std::vector<std::string> out;
  size_t a = 0;
  for (size_t b; (b = s.find('|', a)) != std::string::npos; a = b + 1) out.push_back(s.substr(a, b - a));
  out.push_back(s.substr(a));
  return out;
}

std::string lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

std::string number_text(double v) {
  std::ostringstream o;
  o.precision(15);
  o << v;
  return o.str();
}

// The value of a setting as a number (Int, Float, Bytes) or a string (Str).
double number_of(const int64_t& v) { return static_cast<double>(v); }
double number_of(const double& v) { return v; }
double number_of(const uint64_t& v) { return static_cast<double>(v); }
double number_of(const bool& v) { return v ? 1 : 0; }
double number_of(const std::string&) { return 0; }
std::string* text_of(std::string& v) { return &v; }
template <class T>
std::string* text_of(T&) { return nullptr; }

}  // namespace

namespace {

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  size_t b = s.find_last_not_of(" \t\r\n");
  return s.substr(a, b - a + 1);
}

void assign(const std::string&, std::string& dst, const std::string& v) { dst = v; }
void assign(const std::string& what, int64_t& dst, const std::string& v) { dst = parse_int(what, v); }
void assign(const std::string& what, double& dst, const std::string& v) { dst = parse_float(what, v); }
void assign(const std::string& what, bool& dst, const std::string& v) { dst = parse_bool(what, v); }
void assign(const std::string& what, uint64_t& dst, const std::string& v) { dst = parse_bytes(what, v); }

bool is_bool_kind(const char* kind) { return std::string(kind) == "Bool"; }

}  // namespace

int64_t parse_int(const std::string& what, const std::string& v0) {
  std::string v = trim(v0);
  if (v.empty()) fail(ErrorKind::invalid_argument, what + ": expected an integer, got an empty value");
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (errno == ERANGE || *end != '\0')
    fail(ErrorKind::invalid_argument, what + ": expected an integer, got '" + v0 + "'");
  return x;
}

double parse_float(const std::string& what, const std::string& v0) {
  std::string v = trim(v0);
  errno = 0;
  char* end = nullptr;
  double x = v.empty() ? 0 : std::strtod(v.c_str(), &end);
  if (v.empty() || errno == ERANGE || *end != '\0' || !std::isfinite(x))
    fail(ErrorKind::invalid_argument, what + ": expected a number, got '" + v0 + "'");
  return x;
}

bool parse_bool(const std::string& what, const std::string& v0) {
  std::string v = trim(v0);
  for (auto& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  fail(ErrorKind::invalid_argument, what + ": expected 0/1/true/false, got '" + v0 + "'");
}

uint64_t parse_bytes(const std::string& what, const std::string& v0) {
  std::string v = trim(v0);
  size_t i = 0;
  while (i < v.size() && (std::isdigit(static_cast<unsigned char>(v[i])) || v[i] == '.')) ++i;
  std::string num = v.substr(0, i), unit = trim(v.substr(i));
  if (num.empty()) fail(ErrorKind::invalid_argument, what + ": expected a size such as 4096, 512MiB or 2GiB, got '" + v0 + "'");
  double x = parse_float(what, num);
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mul = 1;
  if (unit.empty() || unit == "b") mul = 1;
  else if (unit == "k" || unit == "kib") mul = 1024.0;
  else if (unit == "m" || unit == "mib") mul = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib") mul = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tib") mul = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb") mul = 1e3;
  else if (unit == "mb") mul = 1e6;
  else if (unit == "gb") mul = 1e9;
  else if (unit == "tb") mul = 1e12;
  else fail(ErrorKind::invalid_argument, what + ": unknown size unit '" + unit + "' in '" + v0 + "'");
  double r = x * mul;
  if (r > 1.8e19) fail(ErrorKind::invalid_argument, what + ": size too large: '" + v0 + "'");
  return static_cast<uint64_t>(r);
}

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

const std::vector<SettingInfo>& setting_table() {
  static const std::vector<SettingInfo> t = {
#define HMOE_SETTING(field, kind, def, flag, env, help) {#field, #kind, def, flag, env, help},
#include "configs/settings.inc"
#undef HMOE_SETTING
  };
  return t;
}

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// HMOE_* variables in the environment that name no setting.
std::vector<std::string> unknown_env_warnings() {
  std::vector<std::string> known = {"HMOE_CUDA"};  // read by the build scripts, not here
#define HMOE_SETTING(field, kind, def, flag, env, help) known.push_back(env);
#include "configs/settings.inc"
#undef HMOE_SETTING
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv = *e;
    const std::string name = kv.substr(0, kv.find('='));
    if (name.rfind("HMOE_", 0) != 0 || std::find(known.begin(), known.end(), name) != known.end()) continue;
    std::string best;
    size_t best_d = std::string::npos;
    for (const auto& k : known)
      if (const size_t d = edit_distance(name, k); d < best_d) best_d = d, best = k;
    std::string w = "warning: environment variable " + name + " is not an hmoe setting and is ignored";
    if (best_d <= std::max<size_t>(2, name.size() / 6)) w += " (did you mean " + best + "?)";
    out.push_back(w + "; `hmoe --help` lists the settings");
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

Settings Settings::defaults() {
  Settings s;
#define HMOE_SETTING(field, kind, def, flag, env, help) assign(std::string("default of ") + flag, s.field, def);
#include "configs/settings.inc"
#undef HMOE_SETTING
  return s;
}

Settings Settings::load(std::vector<std::string>& args) {
  Settings s = defaults();
#define HMOE_SETTING(field, kind, def, flag, env, help)                       \
  if (const char* e = std::getenv(env); e != nullptr && *e != '\0') {         \
    assign(std::string("environment variable ") + env, s.field, e);           \
    s.origins.emplace_back(#field, std::string("environment variable ") + env); \
  } else {                                                                     \
    for (const auto& a : setting_aliases())                                    \
      if (std::string(a.target) == env)                                         \
        if (const char* e2 = std::getenv(a.alias); e2 != nullptr && *e2 != '\0') { \
          assign(std::string("environment variable ") + a.alias, s.field, e2); \
          s.origins.emplace_back(#field, std::string("environment variable ") + a.alias); \
          s.notices.push_back(std::string("notice: reading ") + a.alias + " as " + env + " (an alias for users of Lvllm)"); \
        }                                                                      \
  }
#include "configs/settings.inc"
#undef HMOE_SETTING
  s.warnings = unknown_env_warnings();
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    bool used = false;
#define HMOE_SETTING(field, kind, def, flag, env, help)                                   \
    if (!used) {                                                                           \
      const std::string f = flag;                                                          \
      if (a == f) {                                                                        \
        if (is_bool_kind(#kind) && (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0)) { \
          assign(f, s.field, "1");                                                         \
        } else {                                                                           \
          if (i + 1 >= args.size()) fail(ErrorKind::invalid_argument, f + ": missing value"); \
          assign(f, s.field, args[++i]);                                                   \
        }                                                                                  \
        used = true;                                                                       \
        s.origins.emplace_back(#field, f);                                                 \
      } else if (a.rfind(f + "=", 0) == 0) {                                               \
        assign(f, s.field, a.substr(f.size() + 1));                                        \
        used = true;                                                                       \
        s.origins.emplace_back(#field, f);                                                 \
      } else if (is_bool_kind(#kind) && a == "--no-" + f.substr(2)) {                       \
        assign(f, s.field, "0");                                                           \
        used = true;                                                                       \
        s.origins.emplace_back(#field, a);                                                 \
      }                                                                                    \
    }
#include "configs/settings.inc"
#undef HMOE_SETTING
    if (!used) rest.push_back(a);
  }
  args = std::move(rest);
  s.validate();
  return s;
}

std::string setting_allowed(const std::string& field) {
  std::string out;
  for (const SettingCheck& c : setting_checks()) {
    if (field != c.field) continue;
    std::string part;
    switch (c.kind) {
      case SettingCheck::Kind::range: part = number_text(c.lo) + ".." + number_text(c.hi); break;
      case SettingCheck::Kind::pow2: part = "0 or a power of two"; break;
      case SettingCheck::Kind::auto_or_count: part = "auto or a whole number >= 0"; break;
      case SettingCheck::Kind::choices: {
        const auto w = split_words(c.choices);
        for (size_t i = 0; i < w.size(); ++i) part += (i == 0 ? "" : i + 1 == w.size() ? " or " : ", ") + w[i];
        break;
      }
    }
    out += (out.empty() ? "" : "; ") + part;
  }
  return out;
}

void Settings::validate() {
  for (const SettingCheck& c : setting_checks()) {
    const std::string field = c.field;
    std::string flag, env;
    for (const auto& i : setting_table())
      if (field == i.field) flag = i.flag, env = i.env;
    std::string where = origin(field);
    if (where == "default") where = flag + " / " + env;
    auto bad = [&](const std::string& value) {
      fail(ErrorKind::invalid_argument, where + "=" + value + ": expected " + setting_allowed(field));
    };
    bool found = false;
#define HMOE_SETTING(f, k_, d_, fl_, e_, h_)                                                            \
    if (!found && field == #f) {                                                                      \
      found = true;                                                                                   \
      std::string* text = text_of(f);                                                                 \
      const double v = number_of(f);                                                                  \
      switch (c.kind) {                                                                               \
        case SettingCheck::Kind::range:                                                               \
          if (text || !(v >= c.lo && v <= c.hi)) bad(text ? "'" + *text + "'" : number_text(v));      \
          break;                                                                                      \
        case SettingCheck::Kind::pow2: {                                                              \
          const int64_t n = static_cast<int64_t>(v);                                                  \
          if (text || (n != 0 && (n & (n - 1)) != 0)) bad(text ? "'" + *text + "'" : number_text(v)); \
          break;                                                                                      \
        }                                                                                             \
        case SettingCheck::Kind::auto_or_count: {                                                     \
          if (!text) fail(ErrorKind::internal, field + ": auto-or-count check on a number setting");  \
          *text = lower(*text);                                                                       \
          bool digits = !text->empty() && text->size() <= 12;                                         \
          for (char ch : *text) digits = digits && ch >= '0' && ch <= '9';                            \
          if (*text != "auto" && !digits) bad("'" + *text + "'");                                     \
          break;                                                                                      \
        }                                                                                             \
        case SettingCheck::Kind::choices: {                                                           \
          if (!text) fail(ErrorKind::internal, field + ": choices check on a number setting");        \
          const auto words = split_words(c.choices);                                                  \
          if (std::find(words.begin(), words.end(), lower(*text)) == words.end()) bad("'" + *text + "'"); \
          *text = lower(*text);                                                                       \
          break;                                                                                      \
        }                                                                                             \
      }                                                                                               \
    }
#include "configs/settings.inc"
#undef HMOE_SETTING
    if (!found) fail(ErrorKind::internal, "settings.inc checks unknown setting " + field);
  }
}

const std::vector<SettingAlias>& setting_aliases() {
  static const std::vector<SettingAlias> a = {{"LVLLM_GPU_RESIDENT_MOE_LAYERS", "HMOE_GPU_RESIDENT_MOE_LAYERS"}};
  return a;
}

std::string Settings::origin(const std::string& field) const {
  std::string o = "default";
  for (const auto& [f, where] : origins)
    if (f == field) o = where;  // the last assignment wins, as in load()
  return o;
}

std::string Settings::describe() const {
  std::ostringstream o;
#define HMOE_SETTING(field, kind, def, flag, env, help) o << #field << " = " << field << "\n";
#include "configs/settings.inc"
#undef HMOE_SETTING
  return o.str();
}

std::string settings_markdown() {
  std::ostringstream o;
  o << "| flag | environment variable | type | default | allowed | meaning |\n";
  o << "| --- | --- | --- | --- | --- | --- |\n";
  for (const auto& s : setting_table())
    o << "| `" << s.flag << "` | `" << s.env << "` | " << s.kind << " | `" << s.def << "` | " << setting_allowed(s.field) << " | " << s.help
      << " |\n";
  return o.str();
}

std::string settings_help() {
  std::ostringstream o;
  for (const auto& s : setting_table()) {
    std::string left = std::string("  ") + s.flag + " (" + s.env + ")";
    o << left;
    if (left.size() < 52) o << std::string(52 - left.size(), ' ');
    else o << "\n" << std::string(52, ' ');
    const std::string allowed = setting_allowed(s.field);
    o << s.help << " [default: " << (*s.def ? s.def : "\"\"") << (allowed.empty() ? "" : "; allowed: " + allowed) << "]\n";
  }
  return o.str();
}

}  // namespace hmoe
