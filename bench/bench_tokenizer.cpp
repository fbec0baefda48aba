// Tokenizer throughput: encode and decode MB/s on a few MB of mixed text
// (prose, code, CJK, Cyrillic, emoji, digits, whitespace runs, special
// tokens) for each tokenizer, against @lenml/tokenizers (transformers.js)
// timed by node on the same text in the same run. Also reports whether the
// ids are identical. Prints figures; never fails on time.
// usage: bench_tokenizer [MB] [model...]   (default 4 MB; qwen3 deepseek_v3 llama3)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/text/tokenizer/tokenizer.h"

namespace {

const char* kSamples[] = {
    "The committee reviewed the proposal on Tuesday and, after a long discussion about costs, decided to postpone the vote until next month. ",
    "It's not what we expected; they'd hoped for more. We'll see what happens when the results come in. ",
    "int main(int argc, char** argv) {\n    for (int i = 0; i < argc; ++i) printf(\"%s\\n\", argv[i]);\n    return 0;\n}\n",
    "def tokenize(text: str) -> list[int]:\n    \"\"\"Split text into ids.\"\"\"\n    return [vocab[w] for w in text.split()]\n\n",
    "{\"model\": \"qwen3\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"temperature\": 0.7}\n",
    "人工智能正在改变我们的生活方式，大语言模型可以理解和生成自然语言。今天天气很好，我们去公园散步吧。",
    "東京は日本の首都です。ひらがなとカタカナと漢字を使います。",
    "Москва — столица России. Быстрая коричневая лиса перепрыгивает через ленивую собаку. ",
    "Ελληνικά κείμενα με τόνους. Déjà vu, café, naïve, façade, Zürich, São Paulo. ",
    "Emoji 😀🎉👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ ",
    "2024-05-17 12:34:56.789 INFO request_id=8f14e45fceea167a5a36dedd4bea2543 latency_ms=1234 status=200\n",
    "        \n\n\t\t    ",
    "<|im_start|>user\nWhat is 12345 * 6789?<|im_end|>\n",
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  double mb = argc > 1 ? std::atof(argv[1]) : 4.0;
  std::vector<std::string> models;
  for (int i = 2; i < argc; ++i) models.push_back(argv[i]);
  if (models.empty()) models = {"qwen3", "deepseek_v3", "llama3"};

  std::mt19937 rng(42);
  std::string text;
  size_t target = static_cast<size_t>(mb * 1e6);
  while (text.size() < target) text += kSamples[rng() % (sizeof(kSamples) / sizeof(kSamples[0]))];
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / "hmoe_bench_tokenizer";
  fs::create_directories(dir);
  fs::path text_file = dir / "text.txt";
  std::ofstream(text_file, std::ios::binary) << text;
  // The source tree (for .deps/npm and bench/tokenizer_ref.js), from this file's path.
  std::string npm = fs::path(__FILE__).parent_path().parent_path().string();
  std::string node_path = npm + "/.deps/npm/node_modules";

  std::printf("text: %.2f MB mixed (prose, code, CJK, Cyrillic, emoji, logs, whitespace, specials)\n", text.size() / 1e6);
  std::printf("%-12s %10s %10s %10s %10s %9s %9s %s\n", "model", "enc MB/s", "dec MB/s", "js enc", "js dec", "enc x", "dec x", "ids==js");
  for (const auto& m : models) {
    auto tok = hmoe::tok::Tokenizer::from_dir(node_path + "/@lenml/tokenizer-" + m + "/models");
    tok->encode(text.substr(0, 20000));
    auto t0 = std::chrono::steady_clock::now();
    auto ids = tok->encode(text);
    double enc_s = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    std::string back = tok->decode(ids);
    double dec_s = seconds_since(t0);
    double enc = text.size() / 1e6 / enc_s, dec = back.size() / 1e6 / dec_s;

    fs::path out = dir / (m + "_js.json");
    fs::remove(out);
    std::string cmd = "NODE_PATH='" + node_path + "' node --max-old-space-size=8192 '" + npm + "/bench/tokenizer_ref.js' " + m + " '" +
                      text_file.string() + "' '" + out.string() + "'";
    int rc = std::system(cmd.c_str());
    if (rc != 0 || !fs::exists(out)) {
      std::printf("%-12s %10.1f %10.1f   (JavaScript reference unavailable: run scripts/install-deps)\n", m.c_str(), enc, dec);
      continue;
    }
    nlohmann::json j = nlohmann::json::parse(std::ifstream(out));
    double js_enc = text.size() / 1e6 / j.at("encode_s").get<double>();
    double js_dec = j.at("decoded_bytes").get<double>() / 1e6 / j.at("decode_s").get<double>();
    bool same = j.at("ids").get<std::vector<int32_t>>() == ids;
    std::printf("%-12s %10.1f %10.1f %10.2f %10.2f %8.1fx %8.1fx %s\n", m.c_str(), enc, dec, js_enc, js_dec, enc / js_enc, dec / js_dec,
                same ? "yes" : "NO");
  }
  std::printf("(one thread, one encode()/decode() call over the whole text; MB/s = 1e6 bytes of UTF-8 per second;\n"
              " x = hmoe / JavaScript; the JS side is timed inside node after a warm-up, excluding process start)\n");
  return 0;
}
