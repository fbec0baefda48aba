// The tokenizer test corpus: scripts, code, emoji, whitespace runs, special
// tokens inside text and invalid UTF-8. Shared by the tests and nothing else.
#pragma once
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

}  // namespace hmoe::tok::test
