// The tokenizer test corpus: scripts, code, emoji, whitespace runs, special
// tokens inside text and invalid UTF-8. Shared by the tests and nothing else.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace hmoe::tok::test {

inline std::vector<std::string> corpus() {
  std::vector<std::string> c = {
      "",
      " ",
      "\n",
      "Hello world! It's a test. DON'T PANIC, we'll see; you'RE right, I'M sure, they'VE gone, he'D go, 'll 'ſ 'S",
      "The quick brown fox jumps over the lazy dog. 1234567890 3.14159 1,000,000 -42 +7e-10 0x1F",
      "中文测试：你好，世界！我们今天学习分词器。汉字与标点符号混合，數字123和English。",
      "日本語のテキスト：ひらがな、カタカナ、漢字を混ぜた文章です。トークナイザーはどう分けるかな？",
      "한국어 텍스트입니다. 안녕하세요! 분해된 한글: \xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB\xE1\x84\x80\xE1\x85\xB3\xE1\x86\xAF",
      "Русский текст: Съешь же ещё этих мягких французских булок, да выпей чаю.",
      "Ελληνικά: Τάχιστη αλώπηξ βαφής ψημένη γη, δρασκελίζει υπέρ νωθρού κυνός. ΐΰ",
      "العربية: مرحبا بالعالم! هذا اختبار للمحلل. ١٢٣٤٥٦",
      "עברית: שלום עולם, זה מבחן.",
      "हिन्दी: नमस्ते दुनिया! यह एक परीक्षण है। क़ ख़ ग़ (nukta: \xE0\xA4\x95\xE0\xA4\xBC)",
      "ไทย: สวัสดีชาวโลก นี่คือการทดสอบ",
      "Tiếng Việt: Xin chào thế giới! Đây là một bài kiểm tra. Nguyễn Thị Mỹ Hạnh",
      "Combining: e\xCC\x81 a\xCC\x8A o\xCC\x88\xCC\x81 n\xCC\x83 A\xCC\x8A\xCC\x81 q\xCC\xA3\xCC\x87 \xCC\x81start x\xCC\xA3\xCC\x81\xCC\x80\xCC\x95 \xE2\x84\xAB \xE2\x84\xA6 \xEF\xAC\x81",
      "Emoji: 👨‍👩‍👧‍👦 family, 👍🏽 thumbs, 🇫🇷🇯🇵 flags, 1️⃣ keycap, 🏳️‍🌈 flag, 🧑🏿‍🚀 astronaut, ❤️‍🔥 😀😃😄",
      "int main(int argc, char** argv) {\n    std::vector<int> v{1, 2, 3};\n    for (auto& x : v) x *= 2;  // double\n    return v.size() > 2 ? 0 : 1;\n}\n",
      "def f(x):\n\tif x is None:\n\t\treturn {'a': [1, 2], \"b\": None}\n\treturn x ** 2  # square\n\n\nclass A:\n    pass\n",
      "{\"name\": \"hmoe\", \"ids\": [1, 22, 333], \"nested\": {\"k\": true, \"v\": null}}",
      "<html><body><div class=\"x\">&amp; &lt;tag&gt; </div></body></html>",
      "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nok\n</think>\n\nHello<|endoftext|>",
      "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>text<|reserved_special_token_5|>",
      "<｜begin▁of▁sentence｜><｜User｜>Hello<｜Assistant｜>Hi<｜end▁of▁sentence｜> <|EOT|> <｜tool▁calls▁begin｜>",
      "Partial specials: <|im_sta <|im_end <| |> <｜ <tool_call>{\"a\":1}</tool_call> <|im_end|><|im_end|>",
      "Odd spaces:\xC2\xA0nbsp\xE3\x80\x80ideo\xEF\xBB\xBF" "bom\xC2\x85nel\xE2\x80\xA8ls\xE2\x80\x8Bzwsp\xE2\x80\x83" "em \t\x0B\x0C\r\n done",
      "Line endings\r\nwindows\r\n\r\nand\rmac\n\n\n\nunix  \n  \n\t\n",
      "Invalid: \xFF\xFE abc\xC3 \xED\xA0\x80 surrogate \xF0\x9F\x98 cut \xC0\xAF overlong \xF4\x90\x80\x80 big \x80\x80 cont \xE2\x82",
      "\xF0\x9F\x98",
      "Pneumonoultramicroscopicsilicovolcanoconiosis" "Pneumonoultramicroscopicsilicovolcanoconiosis" "Supercalifragilisticexpialidocious",
      "QmFzZTY0IGVuY29kZWQgYmxvYiB0aGF0IGlzIHF1aXRlIGxvbmcgYW5kIGhhcyBubyBzcGFjZXMgYXQgYWxsIGFuZCBnb2VzIG9uIGFuZCBvbg==",
      "Math: ∀x∈ℝ, ∑ᵢ xᵢ² ≤ ∞; α≈β ⇒ γ≠δ. ½ ¼ ① ⅷ ²³ 𝔸𝕓 𝟙𝟚",
      "URLs: https://example.com/path?q=1&r=two#frag mail@example.org C:\\Windows\\System32",
  };
  c.push_back("spaces:" + std::string(1000, ' ') + "end" + std::string(17, ' '));
  c.push_back(std::string(300, '\n') + "x" + std::string(40, '\t') + std::string(33, '\r'));
  c.push_back("digits " + std::string(301, '7') + " " + std::string(64, '0') + "1");
  c.push_back(std::string(500, 'a') + " " + std::string(200, '!') + " " + std::string(130, '-'));
  std::string han;
  for (int i = 0; i < 80; ++i) han += "的一是不了人我在有他这为之大来以个中上们";
  c.push_back(han);
  std::string mixed;
  for (int i = 0; i < 20; ++i) mixed += "Mix " + std::to_string(i * 7919) + " café naïve 東京 🚀 <|im_end|>\n  ";
  c.push_back(mixed);
  return c;
}

// Seeded random strings over a palette of troublesome code points (all
// assigned by Unicode 14, so PCRE2 and node agree on their properties).
inline std::vector<std::string> fuzz_corpus(size_t count = 300) {
  static const uint32_t palette[] = {
      ' ', ' ', ' ', '\n', '\r', '\t', 'a', 'Z', 'k', 's', 'S', '\'', '"', '0', '7', '.', ',', '-', '!', '<', '|', '>', '_', '#',
      0xA0, 0xE9, 0xDF, 0x17F, 0x300, 0x301, 0x308, 0x323, 0x345, 0x1E9B, 0x212B, 0x2126, 0xFB01, 0x385, 0x390,
      0x915, 0x93C, 0x958, 0x9CB, 0x9BE, 0x9D7, 0xB47, 0xB3E, 0xE01, 0xE33, 0x1100, 0x1161, 0x11A8, 0xAC00, 0xD55C,
      0x4E00, 0x9FA5, 0x9FA6, 0x3042, 0x30A2, 0x30FC, 0x3000, 0x3001, 0xFF01, 0xFF10, 0x2028, 0x2029, 0x200B, 0x200D,
      0xFEFF, 0x85, 0x1680, 0x2003, 0x205F, 0x202F, 0x660, 0x6F1, 0x966, 0xFF11, 0x2160, 0xBD, 0xB2, 0x1D7D9,
      0x1F600, 0x1F44D, 0x1F3FD, 0x1F1EB, 0x1F1F7, 0xFE0F, 0x20E3, 0x2764, 0x1F9D1, 0x1F680, 0x10348, 0x1D400, 0xE000,
      0x5D0, 0x627, 0x64B, 0x410, 0x3B1, 0x1F0, 0x2160, 0x24B6, 0xA9, 0x2122, 0x20AC, 0x2192};
  std::vector<std::string> out;
  uint64_t x = 0x9E3779B97F4A7C15ull;
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  for (size_t i = 0; i < count; ++i) {
    std::string s;
    size_t len = 1 + next() % 40;
    for (size_t k = 0; k < len; ++k) {
      uint32_t cp = palette[next() % (sizeof(palette) / sizeof(palette[0]))];
      if (cp < 0x80) s += static_cast<char>(cp);
      else if (cp < 0x800) s += {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
      else if (cp < 0x10000) s += {static_cast<char>(0xE0 | (cp >> 12)), static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), static_cast<char>(0x80 | (cp & 0x3F))};
      else s += {static_cast<char>(0xF0 | (cp >> 18)), static_cast<char>(0x80 | ((cp >> 12) & 0x3F)), static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), static_cast<char>(0x80 | (cp & 0x3F))};
    }
    if (next() % 8 == 0) s += "<|im_end|>";
    out.push_back(s);
  }
  return out;
}

}  // namespace hmoe::tok::test
