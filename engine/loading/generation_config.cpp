// Default sampling from generation_config.json (see generation_config.h).
#include "engine/loading/generation_config.h"

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "configs/error.h"
#include "io/mmap_file.h"

namespace hmoe {

namespace {

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

// A number in [lo, hi] (lo excluded when open_lo), or nullopt when absent/null.
std::optional<double> number(const nlohmann::json& j, const char* key, double lo, double hi, bool open_lo, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  const auto& v = j[key];
  const double x = v.is_number() ? v.get<double>() : NAN;
  if (!v.is_number() || !std::isfinite(x) || x > hi || x < lo || (open_lo && x == lo))
    fail(ErrorKind::bad_model, path + ": '" + key + "' must be a number in " + (open_lo ? "(" : "[") + fmt(lo) + ", " + fmt(hi) + "], got " +
                                   v.dump());
  return x;
}

}  // namespace

std::string GenerationDefaults::describe() const {
  std::string s;
  auto add = [&](const char* k, const std::string& v) { s += (s.empty() ? "" : ", ") + std::string(k) + " " + v; };
  if (temperature) add("temperature", fmt(*temperature));
  if (top_p) add("top_p", fmt(*top_p));
  if (top_k) add("top_k", std::to_string(*top_k));
  if (min_p) add("min_p", fmt(*min_p));
  if (repetition_penalty) add("repetition_penalty", fmt(*repetition_penalty));
  return s;
}

SamplingParams GenerationDefaults::apply(SamplingParams p) const {
  if (temperature) p.temperature = *temperature;
  if (top_p) p.top_p = *top_p;
  if (top_k) p.top_k = *top_k;
  if (min_p) p.min_p = *min_p;
  if (repetition_penalty) p.repetition_penalty = *repetition_penalty;
  return p;
}

GenerationDefaults load_generation_defaults(const std::string& setting, const std::string& model) {
  GenerationDefaults d;
  namespace fs = std::filesystem;
  std::string path;
  if (setting == "none") return d;
  if (setting == "auto") {
    if (!fs::is_directory(model)) return d;  // a GGUF file: no generation_config.json
    path = (fs::path(model) / "generation_config.json").string();
    if (!io::file_exists(path)) return d;
  } else {
    path = fs::is_directory(setting) ? (fs::path(setting) / "generation_config.json").string() : setting;
    if (!io::file_exists(path))
      fail(ErrorKind::invalid_argument, "generation_config '" + setting + "': " + path + " does not exist (use auto, none, or a directory or file)");
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(io::read_text_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::bad_model, path + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) fail(ErrorKind::bad_model, path + ": must be a JSON object");
  d.source = path;
  d.temperature = number(j, "temperature", 0.0, 2.0, false, path);
  d.top_p = number(j, "top_p", 0.0, 1.0, true, path);
  d.min_p = number(j, "min_p", 0.0, 1.0, false, path);
  d.repetition_penalty = number(j, "repetition_penalty", 0.0, 2.0, true, path);
  if (j.contains("top_k") && !j["top_k"].is_null()) {
    const auto& v = j["top_k"];
    if (!v.is_number_integer() || v.get<int64_t>() < -1 || v.get<int64_t>() > std::numeric_limits<int32_t>::max())
      fail(ErrorKind::bad_model, path + ": 'top_k' must be an integer >= -1 (0 or -1: off), got " + v.dump());
    d.top_k = v.get<int64_t>();
  }
  return d;
}

}  // namespace hmoe
