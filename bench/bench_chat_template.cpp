// Chat template renders per second: the Qwen3 template (fixture) on a
// 20-turn conversation with tools and tool calls, and on a one-message chat.
// Rendering sits on every request's critical path before tokenization; the
// figure to compare against is the request rate a server must sustain
// (thousands/s), and the MB/s of prompt text produced.
#include <chrono>
#include <cstdio>

#include "engine/chat/chat_template.h"

using nlohmann::ordered_json;

static void bench(const char* label, const hmoe::chat::ChatTemplate& t, const ordered_json& req) {
  std::string text = t.render(req);
  size_t n = 0, bytes = 0;
  auto start = std::chrono::steady_clock::now();
  double secs = 0;
  while (secs < 1.0) {
    for (int k = 0; k < 50; ++k) bytes += t.render(req).size();
    n += 50;
    secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  std::printf("%-34s %9.0f renders/s  %7.1f us/render  %7.1f MB/s of prompt (%zu bytes)\n", label, n / secs,
              1e6 * secs / n, bytes / secs / 1e6, text.size());
}

int main(int argc, char** argv) {
  // Default: the fixture scripts/make-fixtures writes under the build directory (run from there).
  std::string dir = argc > 1 ? argv[1] : "fixtures/tiny-qwen3moe";
  auto t = hmoe::chat::ChatTemplate::from_dir(dir);
  ordered_json tool = ordered_json::parse(R"({"type": "function", "function": {"name": "get_weather",
    "description": "Current weather for a city", "parameters": {"type": "object", "properties":
    {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}})");
  ordered_json small = {{"messages", ordered_json::array({{{"role", "user"}, {"content", "Hello!"}}})}};
  ordered_json big = {{"messages", ordered_json::array({{{"role", "system"}, {"content", "You are helpful."}}})},
                      {"tools", ordered_json::array({tool, tool, tool})}};
  for (int i = 0; i < 20; ++i) {
    big["messages"].push_back({{"role", "user"}, {"content", "Question " + std::to_string(i) + " " + std::string(400, 'q')}});
    big["messages"].push_back({{"role", "assistant"}, {"content", ""},
                               {"tool_calls", ordered_json::array({{{"type", "function"}, {"function",
                                 {{"name", "get_weather"}, {"arguments", {{"city", "Oslo"}}}}}}})}});
    big["messages"].push_back({{"role", "tool"}, {"content", "sunny " + std::string(200, 's')}});
    big["messages"].push_back({{"role", "assistant"}, {"content", "<think>\nhm\n</think>\n\nAnswer " + std::string(300, 'a')}});
  }
  std::printf("chat template renders (%s)\n", dir.c_str());
  bench("qwen3, 1 message", *t, small);
  bench("qwen3, 81 messages, 3 tools", *t, big);
  return 0;
}
