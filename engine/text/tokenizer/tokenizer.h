// Byte-level BPE tokenizer that gives the same ids as Hugging Face
// `tokenizers` (checked against @lenml/tokenizers, the transformers.js port)
// for the Qwen3, DeepSeek-V3 and Llama-3 families, loaded from tokenizer.json
// or from a GGUF file's tokenizer.ggml.* metadata.
//
// Pipeline of encode(): added tokens are matched first on the raw text
// (leftmost-longest, never split by BPE); each remaining section is
// normalized (NFC, when the model says so), split by the model's regex
// pre-tokenizers (PCRE2, JavaScript \s semantics), and every piece is BPE'd
// over its UTF-8 bytes with merge ranks.
//
// Regex semantics follow JavaScript (the reference): \s is JavaScript's
// whitespace set (includes U+FEFF, excludes U+0085), and the contraction group
// (?i:'s|...) matches only ASCII letters. Hugging Face's Rust regex differs
// from this only on those exotic characters. Unicode tables: PCRE2 and NFC
// data are Unicode 14 (Debian 12); characters newer than that may differ.
//
// Added tokens from GGUF: llama.cpp token type "control" is special,
// "user-defined" is not; the converter marks some tokens control that
// tokenizer.json calls non-special (e.g. <|fim_prefix|>), which only changes
// is_special()/skip_special, not the ids.
//
// Invalid UTF-8 input: encode() first replaces every maximal invalid subpart
// with U+FFFD (the WHATWG/TextDecoder rule, also Python's errors="replace"),
// then tokenizes the result. Such text does not round-trip; valid UTF-8 does:
// decode(encode(t)) == t.
//
// decode() concatenates the tokens' bytes and applies the same lossy UTF-8
// rule, so it always returns valid UTF-8. transformers' optional
// clean_up_tokenization_spaces is not applied.
//
// Thread safety: a Tokenizer is immutable after loading; encode/decode may run
// concurrently from any number of threads (each call has its own scratch and
// word cache). An IncrementalDecoder belongs to one stream (one thread).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hmoe::tok {

class Tokenizer {
 public:
  // dir holds tokenizer.json (+ tokenizer_config.json for added-token flags,
  // bos/eos). Throws hmoe::Error (ErrorKind::bad_model) naming file+problem,
  // ErrorKind::unsupported for a valid but unimplemented component.
  static std::unique_ptr<Tokenizer> from_dir(const std::string& dir);
  // The tokenizer embedded in a GGUF file (tokenizer.ggml.model "gpt2" with a
  // known tokenizer.ggml.pre: qwen2, llama-bpe, deepseek-v3).
  static std::unique_ptr<Tokenizer> from_gguf(const std::string& gguf_path);
  ~Tokenizer();

  // No BOS/EOS added. parse_special=false treats special (control) added
  // tokens as plain text; non-special added tokens are still matched.
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;
  // Throws ErrorKind::invalid_argument on an id outside [0, vocab_size()) or
  // an id that no token has.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;
  int32_t vocab_size() const;  // incl. added tokens (max id + 1)
  // `token` as spelled in the vocabulary (byte-level form, e.g. "Ġthe") or an
  // added token's content.
  std::optional<int32_t> token_to_id(std::string_view token) const;
  bool is_special(int32_t id) const;
  // Raw bytes of one token (may be a partial UTF-8 sequence). Throws
  // invalid_argument like decode().
  std::string id_to_piece(int32_t id) const;

  std::optional<int32_t> bos_id() const;  // from tokenizer_config.json / GGUF, if any
  std::optional<int32_t> eos_id() const;

  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Streaming: feed ids one by one; push() returns the text that is now
// complete (never a partial UTF-8 sequence: incomplete trailing bytes are
// held back; bytes that can no longer become valid are emitted as U+FFFD).
// finish() flushes (invalid leftovers become U+FFFD) and resets the stream.
// The concatenation of all push() results and finish() equals decode(all).
// The Tokenizer must outlive the decoder.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tok, bool skip_special = false);
  std::string push(int32_t id);
  std::string finish();

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace hmoe::tok
