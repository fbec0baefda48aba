// Settings: the typed, immutable view of configs/settings.inc.
//
// Contract: Settings::load() reads the environment (the only place in hmoe that does)
// and then the command-line flags it recognises, removing them from `args`,
// and validates every value once against the table's allowed values
// (settings.inc: ranges, choices). Bad values throw hmoe::Error naming the
// flag or variable and the value. After load() a Settings is read-only and
// safe to share between threads; the modules it is passed to (as typed
// option structs built from it) take its values as valid.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace hmoe {

struct Settings {
#define HMOE_SETTING_Str std::string
#define HMOE_SETTING_Int int64_t
#define HMOE_SETTING_Float double
#define HMOE_SETTING_Bool bool
#define HMOE_SETTING_Bytes uint64_t
#define HMOE_SETTING(field, kind, def, flag, env, help) HMOE_SETTING_##kind field{};
#include "configs/settings.inc"
#undef HMOE_SETTING

  // Defaults only (no environment, no flags).
  static Settings defaults();
  // Defaults, then environment, then flags found in args (consumed), validated.
  static Settings load(std::vector<std::string>& args);
  // The check load() ends with, for settings changed in code (tests, tools):
  // choice settings are lower-cased; a value outside what settings.inc
  // allows throws Error(invalid_argument) naming its origin, the value and
  // what is allowed.
  void validate();

  // Where each value came from, for `hmoe settings`.
  std::string describe() const;

  // Where `field` was set: "environment variable X", "--flag" or "default".
  // Errors about a value should name it.
  std::string origin(const std::string& field) const;
  // Messages for the user from load() (an alias was read, ...); the caller prints them.
  std::vector<std::string> notices;
  // One line per HMOE_* environment variable that is no setting (a typo is
  // otherwise silently ignored), with the nearest setting's name; the hmoe
  // command prints them.
  std::vector<std::string> warnings;
  std::vector<std::pair<std::string, std::string>> origins;  // field -> origin, set by load()
};

// Other programs' environment variable names accepted for a setting, read
// when the HMOE_ variable is unset, with a notice (settings.cpp holds the list).
struct SettingAlias {
  const char* alias;  // e.g. LVLLM_GPU_RESIDENT_MOE_LAYERS
  const char* target;  // the HMOE_ variable it stands for
};
const std::vector<SettingAlias>& setting_aliases();

struct SettingInfo {
  const char* field;
  const char* kind;
  const char* def;
  const char* flag;
  const char* env;
  const char* help;
};
const std::vector<SettingInfo>& setting_table();

// What a setting allows, in words ("1..4096", "auto, bf16 or f32"); empty
// when the table lists nothing for it.
std::string setting_allowed(const std::string& field);

// Markdown table of every setting (configs/SETTINGS.md is this output).
std::string settings_markdown();
// Plain-text list for --help.
std::string settings_help();

// Value parsers shared with commands; `what` names the flag or variable.
int64_t parse_int(const std::string& what, const std::string& v);
double parse_float(const std::string& what, const std::string& v);
bool parse_bool(const std::string& what, const std::string& v);
uint64_t parse_bytes(const std::string& what, const std::string& v);

// Environment lookup for names outside the table (aliases such as
// LVLLM_GPU_RESIDENT_MOE_LAYERS); returns empty when unset.
std::string env_or_empty(const char* name);

}  // namespace hmoe
