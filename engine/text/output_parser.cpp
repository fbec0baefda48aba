#include "engine/text/output_parser.h"

#include <array>
#include <nlohmann/json.hpp>

#include "engine/serving/random_id.h"
#include "engine/text/json_guard.h"

namespace hmoe {

namespace {
constexpr std::string_view kThink = "<think>", kThinkEnd = "</think>", kTool = "<tool_call>", kToolEnd = "</tool_call>";

bool all_space(std::string_view s) {
  for (char c : s)
    if (c != ' ' && c != '\n' && c != '\t' && c != '\r') return false;
  return true;
}
}  // namespace

void ParsedDelta::append(ParsedDelta&& o) {
  content += o.content;
  reasoning += o.reasoning;
  for (auto& t : o.tool_calls) tool_calls.push_back(std::move(t));
}

bool prompt_opens_think(std::string_view p) {
  while (!p.empty() && (p.back() == '\n' || p.back() == ' ')) p.remove_suffix(1);
  return p.ends_with(kThink);
}

OutputParser::OutputParser(bool parse_tools, bool parse_reasoning, bool start_in_reasoning, uint64_t id_seed)
    : tools_(parse_tools), reasoning_(parse_reasoning),
      mode_(parse_reasoning && start_in_reasoning ? Mode::reasoning : Mode::content),
      id_state_(id_seed), seeded_(id_seed != 0) {}

std::string OutputParser::next_id() {
  if (!seeded_) return "call_" + random_alnum(24);
  static constexpr char kAlpha[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) {
    id_state_ = id_state_ * 6364136223846793005ull + 1442695040888963407ull;
    id += kAlpha[(id_state_ >> 33) % 62];
  }
  return id;
}

void OutputParser::emit_text(ParsedDelta& d, std::string_view s) {
  if (s.empty()) return;
  if (mode_ == Mode::reasoning) d.reasoning.append(s);
  else if (mode_ == Mode::tool) tool_buf_.append(s);
  else if (!(tool_calls_ > 0 && all_space(s))) d.content.append(s);
}

void OutputParser::close_tool(ParsedDelta& d) {
  mode_ = Mode::content;
  // Model output can nest without limit: deeper than this stays text (no deep value is built).
  nlohmann::json j = json_depth_ok(tool_buf_, 64) ? nlohmann::json::parse(tool_buf_, nullptr, false) : nlohmann::json();
  if (j.is_object() && j.contains("name") && j["name"].is_string() && j["name"].get<std::string>().size() > 0) {
    std::string args = "{}";
    if (j.contains("arguments")) {
      const auto& a = j["arguments"];
      args = a.is_string() ? a.get<std::string>() : a.dump();
    } else if (j.contains("parameters")) {
      args = j["parameters"].dump();
    }
    d.tool_calls.push_back({next_id(), j["name"].get<std::string>(), args});
    ++tool_calls_;
  } else {
    d.content += std::string(kTool) + tool_buf_ + std::string(kToolEnd);
  }
  tool_buf_.clear();
}

ParsedDelta OutputParser::push(std::string_view text) {
  ParsedDelta d;
  pending_.append(text);
  for (;;) {
    // Tags that can end or switch the current mode.
    std::array<std::string_view, 2> tags{};
    size_t ntags = 0;
    if (mode_ == Mode::content) {
      if (reasoning_) tags[ntags++] = kThink;
      if (tools_) tags[ntags++] = kTool;
    } else if (mode_ == Mode::reasoning) {
      tags[ntags++] = kThinkEnd;
    } else {
      tags[ntags++] = kToolEnd;
    }
    size_t best = std::string::npos;
    std::string_view which;
    for (size_t i = 0; i < ntags; ++i) {
      size_t at = pending_.find(tags[i]);
      if (at < best) {
        best = at;
        which = tags[i];
      }
    }
    if (best == std::string::npos) {
      // A closing </think> without an opening tag: what came before was
      // reasoning whose <think> was in the prompt; in streaming it has already
      // gone out as content, so only the tag itself is removed.
      size_t stray = (mode_ == Mode::content && reasoning_) ? pending_.find(kThinkEnd) : std::string::npos;
      if (stray != std::string::npos) {
        emit_text(d, std::string_view(pending_).substr(0, stray));
        pending_.erase(0, stray + kThinkEnd.size());
        continue;
      }
      // Hold back a tail that may be the start of a tag.
      size_t keep = 0;
      auto hold = [&](std::string_view tag) {
        for (size_t k = std::min(tag.size() - 1, pending_.size()); k > keep; --k)
          if (pending_.compare(pending_.size() - k, k, tag.data(), k) == 0) {
            keep = k;
            break;
          }
      };
      for (size_t i = 0; i < ntags; ++i) hold(tags[i]);
      if (mode_ == Mode::content && reasoning_) hold(kThinkEnd);
      emit_text(d, std::string_view(pending_).substr(0, pending_.size() - keep));
      pending_.erase(0, pending_.size() - keep);
      return d;
    }
    emit_text(d, std::string_view(pending_).substr(0, best));
    pending_.erase(0, best + which.size());
    if (which == kThink) mode_ = Mode::reasoning;
    else if (which == kThinkEnd) mode_ = Mode::content;
    else if (which == kTool) mode_ = Mode::tool;
    else close_tool(d);
  }
}

ParsedDelta OutputParser::finish() {
  ParsedDelta d;
  emit_text(d, pending_);
  pending_.clear();
  if (mode_ == Mode::tool) {  // a call cut off (max_tokens): not content, and no call
    tool_buf_.clear();
    mode_ = Mode::content;
  }
  return d;
}

}  // namespace hmoe
