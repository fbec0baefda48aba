// UTF-8 and Unicode helpers for the tokenizer: WHATWG-exact lossy UTF-8
// decoding (the same U+FFFD substitution as TextDecoder, Python's
// errors="replace" and Rust's from_utf8_lossy) and NFC normalization.
// Pure functions, thread-safe, no global state beyond constant tables.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace hmoe::tok {

// Appends `in` to `out` with every maximal invalid subpart replaced by U+FFFD.
// With final=false an incomplete but so far valid sequence at the end is not
// consumed; returns the number of bytes consumed (always in.size() if final).
// Feeding a byte stream chunk by chunk (final=false, keeping the unconsumed
// tail) and then final=true gives exactly the one-shot result.
size_t utf8_append_lossy(std::string_view in, std::string& out, bool final);

// True when `s` is valid UTF-8 (no surrogates, no overlongs, <= U+10FFFF).
bool utf8_valid(std::string_view s);

// Unicode NFC (canonical composition) of valid UTF-8 `s`, appended to `out`.
// Text with nothing to compose or reorder is copied unchanged (fast path).
void nfc_append(std::string_view s, std::string& out);

// Decodes one code point at s[i] of valid UTF-8 and advances i.
inline uint32_t utf8_next(std::string_view s, size_t& i) {
  auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) { ++i; return b; }
  if (b < 0xE0) { uint32_t c = ((b & 0x1Fu) << 6) | (s[i + 1] & 0x3Fu); i += 2; return c; }
  if (b < 0xF0) {
    uint32_t c = ((b & 0x0Fu) << 12) | ((s[i + 1] & 0x3Fu) << 6) | (s[i + 2] & 0x3Fu);
    i += 3;
    return c;
  }
  uint32_t c = ((b & 0x07u) << 18) | ((s[i + 1] & 0x3Fu) << 12) | ((s[i + 2] & 0x3Fu) << 6) | (s[i + 3] & 0x3Fu);
  i += 4;
  return c;
}

void utf8_put(uint32_t cp, std::string& out);

}  // namespace hmoe::tok
