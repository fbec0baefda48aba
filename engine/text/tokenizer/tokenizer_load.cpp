// Loading: tokenizer.json (+ tokenizer_config.json) and GGUF metadata both
// fill the same Impl through its builders, so the two paths cannot drift.
// Regexes are rewritten to JavaScript semantics (what @lenml/tokenizers and
// transformers.js run): \s is JavaScript's whitespace set, and the
// case-insensitive contraction group is replaced as transformers.js does.
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "configs/error.h"
#include "engine/text/tokenizer/tokenizer_impl.h"
#include "engine/text/tokenizer/unicode.h"
#include "io/gguf.h"

namespace hmoe::tok {
namespace {

using json = nlohmann::json;

constexpr const char* kJsSpace = "\\t\\n\\x{0B}\\f\\r \\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}\\x{FEFF}";

std::string js_compatible(std::string p) {
  const std::string ci = "(?i:'s|'t|'re|'ve|'m|'ll|'d)";
  for (size_t at; (at = p.find(ci)) != std::string::npos;)
    p.replace(at, ci.size(), "(?:'([sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))");
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size();) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char d = p[i + 1];
      i += 2;
      if (d == 's') {
        out += in_class ? std::string(kJsSpace) : std::string("[") + kJsSpace + "]";
      } else if (d == 'S' && !in_class) {
        out += std::string("[^") + kJsSpace + "]";
      } else {
        out += c;
        out += d;
      }
      continue;
    }
    out += c;
    ++i;
    if (!in_class && c == '[') {
      in_class = true;
      if (i < p.size() && p[i] == '^') out += p[i++];
      if (i < p.size() && p[i] == ']') out += p[i++];
    } else if (in_class && c == ']') {
      in_class = false;
    }
  }
  return out;
}

// Pre-tokenizer regexes of the GGUF `tokenizer.ggml.pre` names we know (the
// same strings as the models' tokenizer.json).
const char* kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* kDeepseekV3Regex[] = {
    "\\p{N}{1,3}",
    "[\xE4\xB8\x80-\xE9\xBE\xA5\xE3\x81\x80-\xE3\x82\x9F\xE3\x82\xA0-\xE3\x83\xBF]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
};
const char* kGpt2Regex = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

[[noreturn]] void bad(const std::string& file, const std::string& msg) { fail(ErrorKind::bad_model, file + ": " + msg); }
[[noreturn]] void unsupported(const std::string& file, const std::string& msg) {
  fail(ErrorKind::unsupported, file + ": " + msg);
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) bad(path, "cannot open (missing or unreadable)");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

json parse_json(const std::string& path, const std::string& text) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    bad(path, std::string("malformed JSON: ") + e.what());
  }
}

void load_normalizer(Tokenizer::Impl& t, const json& n, const std::string& file) {
  if (n.is_null()) return;
  std::string type = n.value("type", "");
  if (type == "Sequence") {
    for (const auto& x : n.at("normalizers")) load_normalizer(t, x, file);
  } else if (type == "NFC") {
    t.nfc = true;
  } else {
    unsupported(file, "normalizer '" + type + "' is not supported (supported: NFC, Sequence)");
  }
}

void load_pre_tokenizer(Tokenizer::Impl& t, const json& p, const std::string& file, bool& byte_level) {
  if (p.is_null()) return;
  std::string type = p.value("type", "");
  if (type == "Sequence") {
    for (const auto& x : p.at("pretokenizers")) load_pre_tokenizer(t, x, file, byte_level);
  } else if (type == "Split") {
    if (!p.at("pattern").contains("Regex")) unsupported(file, "Split pre-tokenizer with a String pattern is not supported");
    if (p.value("behavior", "") != "Isolated" || p.value("invert", false))
      unsupported(file, "Split pre-tokenizer behavior '" + p.value("behavior", "") + "' is not supported (supported: Isolated)");
    t.add_split(p.at("pattern").at("Regex").get<std::string>());
  } else if (type == "ByteLevel") {
    if (p.value("add_prefix_space", false)) unsupported(file, "ByteLevel add_prefix_space=true is not supported");
    if (p.value("use_regex", true)) t.add_split(kGpt2Regex);
    byte_level = true;
  } else {
    unsupported(file, "pre-tokenizer '" + type + "' is not supported (supported: Sequence, Split, ByteLevel)");
  }
}

AddedToken added_from_json(const json& a) {
  AddedToken t;
  t.content = a.at("content").get<std::string>();
  t.special = a.value("special", false);
  t.lstrip = a.value("lstrip", false);
  t.rstrip = a.value("rstrip", false);
  return t;
}

std::optional<int32_t> config_token(const Tokenizer& tok, const json& cfg, const char* key) {
  if (!cfg.contains(key)) return std::nullopt;
  const json& v = cfg.at(key);
  std::string s;
  if (v.is_string()) s = v.get<std::string>();
  else if (v.is_object() && v.contains("content")) s = v.at("content").get<std::string>();
  else return std::nullopt;
  return tok.token_to_id(s);
}

}  // namespace

// --- builders ---------------------------------------------------------------------
void Tokenizer::Impl::add_vocab(std::string_view token, int32_t id) {
  if (id < 0) bad(source, "negative token id " + std::to_string(id));
  size_t i = static_cast<size_t>(id);
  if (i >= pieces.size()) {
    pieces.resize(i + 1);
    kinds.resize(i + 1, TokenKind::none);
  }
  std::string raw;
  byte_level_decode(token, raw);
  vocab_bytes.emplace(raw, id);
  pieces[i] = std::move(raw);
  kinds[i] = TokenKind::normal;
}

void Tokenizer::Impl::add_added(AddedToken a) {
  if (a.content.empty()) bad(source, "added token " + std::to_string(a.id) + " has empty content");
  if (a.id < 0) bad(source, "added token '" + a.content + "' has a negative id");
  size_t i = static_cast<size_t>(a.id);
  if (i >= pieces.size()) {
    pieces.resize(i + 1);
    kinds.resize(i + 1, TokenKind::none);
  }
  pieces[i] = a.content;
  kinds[i] = a.special ? TokenKind::special : TokenKind::added;
  if (auto it = added_ids.find(a.content); it != added_ids.end()) {
    for (auto& x : added)
      if (x.content == a.content) x = a;
    it->second = a.id;
    return;
  }
  added_ids.emplace(a.content, a.id);
  added.push_back(std::move(a));
}

void Tokenizer::Impl::add_merge(std::string_view a, std::string_view b, int32_t rank) {
  std::string ra, rb;
  byte_level_decode(a, ra);
  byte_level_decode(b, rb);
  auto ia = vocab_bytes.find(ra), ib = vocab_bytes.find(rb), im = vocab_bytes.find(ra + rb);
  if (ia == vocab_bytes.end() || ib == vocab_bytes.end() || im == vocab_bytes.end())
    bad(source, "merge " + std::to_string(rank) + " ('" + std::string(a) + "' '" + std::string(b) + "') uses a token not in the vocabulary");
  merges.insert(ia->second, ib->second, rank, im->second);
}

void Tokenizer::Impl::add_split(const std::string& pattern) {
  std::string p = js_compatible(pattern);
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    bad(source, "pre-tokenizer regex /" + pattern + "/ does not compile at offset " + std::to_string(off) + ": " +
                    reinterpret_cast<char*>(msg));
  }
  SplitRegex r;
  r.source = pattern;
  r.code.reset(code);
  r.jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  splits.push_back(std::move(r));
}

void Tokenizer::Impl::finish() {
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_bytes.find(std::string(1, static_cast<char>(b)));
    if (it == vocab_bytes.end()) {
      std::string spelled;
      utf8_put(byte_to_cp(static_cast<uint8_t>(b)), spelled);
      bad(source, "byte-level vocabulary lacks the token for byte " + std::to_string(b) + " ('" + spelled + "')");
    }
    byte_id[static_cast<size_t>(b)] = it->second;
  }
  trie_all.build(added, true);
  trie_plain.build(added, false);
}

// --- tokenizer.json ------------------------------------------------------------------
std::unique_ptr<Tokenizer> Tokenizer::from_dir(const std::string& dir) {
  auto impl = std::make_unique<Impl>();
  std::string file = dir + "/tokenizer.json";
  impl->source = file;
  json j = parse_json(file, read_file(file));
  try {
    if (!j.is_object() || !j.contains("model")) bad(file, "no 'model' object");
    const json& m = j.at("model");
    std::string type = m.value("type", "BPE");
    if (type != "BPE") unsupported(file, "model type '" + type + "' is not supported (supported: BPE)");
    if (m.value("byte_fallback", false)) unsupported(file, "BPE byte_fallback is not supported");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (m.contains(k) && m.at(k).is_string() && !m.at(k).get<std::string>().empty())
        unsupported(file, std::string("BPE ") + k + " is not supported");
    impl->ignore_merges = m.value("ignore_merges", false);
    const json& vocab = m.at("vocab");
    if (!vocab.is_object()) bad(file, "model.vocab is not an object");
    impl->vocab_bytes.reserve(vocab.size());
    for (auto it = vocab.begin(); it != vocab.end(); ++it) impl->add_vocab(it.key(), it.value().get<int32_t>());
    const json& merges = m.at("merges");
    impl->merges.reserve(merges.size());
    int32_t rank = 0;
    for (const auto& mg : merges) {
      if (mg.is_string()) {
        const std::string& s = mg.get_ref<const std::string&>();
        size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          bad(file, "merge " + std::to_string(rank) + " '" + s + "' is not two tokens separated by one space");
        impl->add_merge(std::string_view(s).substr(0, sp), std::string_view(s).substr(sp + 1), rank);
      } else if (mg.is_array() && mg.size() == 2) {
        impl->add_merge(mg[0].get_ref<const std::string&>(), mg[1].get_ref<const std::string&>(), rank);
      } else {
        bad(file, "merge " + std::to_string(rank) + " is neither \"a b\" nor [a, b]");
      }
      ++rank;
    }
    if (j.contains("added_tokens"))
      for (const auto& a : j.at("added_tokens")) {
        AddedToken t = added_from_json(a);
        t.id = a.at("id").get<int32_t>();
        impl->add_added(std::move(t));
      }
    load_normalizer(*impl, j.value("normalizer", json()), file);
    bool byte_level = false;
    load_pre_tokenizer(*impl, j.value("pre_tokenizer", json()), file, byte_level);
    if (!byte_level) unsupported(file, "only byte-level BPE is supported (no ByteLevel pre-tokenizer found)");
    if (j.contains("decoder") && !j.at("decoder").is_null()) {
      std::string dt = j.at("decoder").value("type", "");
      if (dt != "ByteLevel") unsupported(file, "decoder '" + dt + "' is not supported (supported: ByteLevel)");
    }
  } catch (const json::exception& e) {
    bad(file, std::string("unexpected structure: ") + e.what());
  }

  json cfg;
  std::string cfg_file = dir + "/tokenizer_config.json";
  if (std::ifstream(cfg_file).good()) {
    cfg = parse_json(cfg_file, read_file(cfg_file));
    try {
      if (cfg.contains("added_tokens_decoder") && cfg.at("added_tokens_decoder").is_object())
        for (auto it = cfg.at("added_tokens_decoder").begin(); it != cfg.at("added_tokens_decoder").end(); ++it) {
          AddedToken t = added_from_json(it.value());
          t.id = std::stoi(it.key());
          impl->add_added(std::move(t));
        }
    } catch (const std::exception& e) {
      bad(cfg_file, std::string("bad added_tokens_decoder: ") + e.what());
    }
  }
  impl->finish();
  std::unique_ptr<Tokenizer> tok(new Tokenizer(std::move(impl)));
  if (cfg.is_object()) {
    tok->impl_->bos = config_token(*tok, cfg, "bos_token");
    tok->impl_->eos = config_token(*tok, cfg, "eos_token");
  }
  return tok;
}

// --- GGUF ------------------------------------------------------------------------------
std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const std::string& path) {
  auto g = io::GgufFile::open(path);
  auto impl = std::make_unique<Impl>();
  impl->source = path;
  std::string model(g->get("tokenizer.ggml.model").as_string("tokenizer.ggml.model"));
  if (model != "gpt2") unsupported(path, "tokenizer.ggml.model '" + model + "' is not supported (supported: gpt2, byte-level BPE)");
  std::string pre = g->find("tokenizer.ggml.pre") ? std::string(g->get("tokenizer.ggml.pre").as_string("tokenizer.ggml.pre")) : "default";
  if (pre == "qwen2") {
    impl->nfc = true;
    impl->add_split(kQwen2Regex);
  } else if (pre == "llama-bpe" || pre == "llama3") {
    impl->ignore_merges = true;
    impl->add_split(kLlama3Regex);
  } else if (pre == "deepseek-v3") {
    for (const char* r : kDeepseekV3Regex) impl->add_split(r);
  } else {
    unsupported(path, "tokenizer.ggml.pre '" + pre + "' is not supported (supported: qwen2, llama-bpe, deepseek-v3)");
  }
  const auto& tokens = g->get("tokenizer.ggml.tokens").as_strings("tokenizer.ggml.tokens");
  std::vector<int32_t> types;
  if (g->find("tokenizer.ggml.token_type")) types = g->get("tokenizer.ggml.token_type").as_array<int32_t>("tokenizer.ggml.token_type");
  if (!types.empty() && types.size() != tokens.size())
    bad(path, "tokenizer.ggml.token_type has " + std::to_string(types.size()) + " entries for " + std::to_string(tokens.size()) + " tokens");
  // llama.cpp token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
  std::vector<AddedToken> added;
  for (size_t i = 0; i < tokens.size(); ++i) {
    int32_t ty = types.empty() ? 1 : types[i];
    if (ty == 3 || ty == 4) {
      AddedToken a;
      a.content = std::string(tokens[i]);
      a.id = static_cast<int32_t>(i);
      a.special = ty == 3;
      added.push_back(std::move(a));
    } else if (ty != 5) {
      impl->add_vocab(tokens[i], static_cast<int32_t>(i));
    }
  }
  const auto& merges = g->get("tokenizer.ggml.merges").as_strings("tokenizer.ggml.merges");
  impl->merges.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    std::string_view s = merges[r];
    size_t sp = s.find(' ');
    if (sp == std::string_view::npos) bad(path, "tokenizer.ggml.merges[" + std::to_string(r) + "] '" + std::string(s) + "' has no space");
    impl->add_merge(s.substr(0, sp), s.substr(sp + 1), static_cast<int32_t>(r));
  }
  for (auto& a : added) impl->add_added(std::move(a));
  auto id_key = [&](const char* key) -> std::optional<int32_t> {
    const io::GgufValue* v = g->find(key);
    if (!v) return std::nullopt;
    int64_t id = v->as_i64(key);
    if (id < 0 || id >= static_cast<int64_t>(impl->kinds.size())) bad(path, std::string(key) + " " + std::to_string(id) + " is out of range");
    return static_cast<int32_t>(id);
  };
  impl->bos = id_key("tokenizer.ggml.bos_token_id");
  impl->eos = id_key("tokenizer.ggml.eos_token_id");
  impl->finish();
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

}  // namespace hmoe::tok
