// Jinja2 tokenization, following jinja2/lexer.py's rules for whitespace
// control (lstrip_blocks applies to block and comment tags, not to {{ }};
// trim_blocks removes one newline after %} and #}).
#include "engine/text/chat/lexer.h"

#include <cctype>

#include "configs/error.h"
#include "engine/text/chat/value.h"

namespace hmoe::chat {
namespace {

class Lexer {
 public:
  explicit Lexer(const std::string& src) : src_(normalize(src)) {}

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      size_t tag = find_tag(pos);
      std::string text = src_.substr(pos, (tag == std::string::npos ? src_.size() : tag) - pos);
      if (tag == std::string::npos) {
        emit_text(text, pos);
        break;
      }
      char kind = src_[tag + 1];  // '{', '%' or '#'
      char ctl = tag + 2 < src_.size() ? src_[tag + 2] : 0;
      if (ctl == '-') {
        size_t end = text.find_last_not_of(" \t\n\r\f\v");
        text.resize(end == std::string::npos ? 0 : end + 1);
      } else if (ctl != '+' && kind != '{') {
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
            text.find_first_not_of(" \t\f\v\r", l_pos) == std::string::npos)
          text.resize(l_pos);
      }
      emit_text(text, pos);
      size_t body = tag + 2 + ((ctl == '-' || ctl == '+') ? 1 : 0);
      if (kind == '#') {
        pos = lex_comment(tag, body, line_starting);
      } else if (kind == '%' && is_raw(body)) {
        pos = lex_raw(tag, body, line_starting);
      } else {
        pos = lex_tag(kind, tag, body, line_starting);
      }
    }
    tokens_.push_back({Tok::eof, "", line_of(src_.size()), col_of(src_.size())});
    return std::move(tokens_);
  }

 private:
  static std::string normalize(const std::string& in) {
    std::string s;
    s.reserve(in.size());
    for (size_t k = 0; k < in.size(); ++k) {
      if (in[k] == '\r') {
        s.push_back('\n');
        if (k + 1 < in.size() && in[k + 1] == '\n') ++k;
      } else {
        s.push_back(in[k]);
      }
    }
    if (!s.empty() && s.back() == '\n') s.pop_back();  // keep_trailing_newline=False
    return s;
  }

  [[noreturn]] void fail_at(size_t pos, const std::string& what) const {
    throw Error(ErrorKind::bad_model, "chat template " + std::to_string(line_of(pos)) + ":" +
                                          std::to_string(col_of(pos)) + ": " + what);
  }

  int line_of(size_t pos) const {
    int line = 1;
    for (size_t k = 0; k < pos && k < src_.size(); ++k) line += src_[k] == '\n';
    return line;
  }
  int col_of(size_t pos) const {
    size_t nl = pos == 0 ? std::string::npos : src_.rfind('\n', pos - 1);
    return int(pos - (nl == std::string::npos ? 0 : nl + 1)) + 1;
  }
  // line_of is O(n); tokens cache the line incrementally instead.
  Token make(Tok k, std::string v, size_t pos) {
    while (line_pos_ < pos) {
      if (src_[line_pos_] == '\n') {
        ++line_;
        line_start_ = line_pos_ + 1;
      }
      ++line_pos_;
    }
    return {k, std::move(v), line_, int(pos - line_start_) + 1};
  }

  size_t find_tag(size_t pos) const {
    for (size_t k = src_.find('{', pos); k != std::string::npos; k = src_.find('{', k + 1)) {
      if (k + 1 < src_.size() && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#'))
        return k;
    }
    return std::string::npos;
  }

  void emit_text(const std::string& text, size_t pos) {
    if (!text.empty()) tokens_.push_back(make(Tok::text, text, pos));
  }

  // After a tag end: "-" strips all following whitespace; trim_blocks eats one newline.
  size_t after_end(size_t pos, bool strip, bool trim, bool& line_starting) {
    size_t start = pos;
    if (strip) {
      while (pos < src_.size() && std::isspace((unsigned char)src_[pos])) ++pos;
    } else if (trim && pos < src_.size() && src_[pos] == '\n') {
      ++pos;
    }
    line_starting = pos > start && src_[pos - 1] == '\n';
    return pos;
  }

  size_t lex_comment(size_t tag, size_t body, bool& line_starting) {
    size_t end = src_.find("#}", body);
    if (end == std::string::npos) fail_at(tag, "unterminated comment '{#'");
    char ctl = end > body ? src_[end - 1] : 0;
    return after_end(end + 2, ctl == '-', ctl != '+', line_starting);
  }

  size_t skip_ws(size_t p) const {
    while (p < src_.size() && std::isspace((unsigned char)src_[p])) ++p;
    return p;
  }

  bool word_at(size_t p, const char* w) const {
    size_t n = std::char_traits<char>::length(w);
    return src_.compare(p, n, w) == 0 &&
           (p + n >= src_.size() || !(std::isalnum((unsigned char)src_[p + n]) || src_[p + n] == '_'));
  }

  bool is_raw(size_t body) const { return word_at(skip_ws(body), "raw"); }

  // {% raw %}...{% endraw %}: the body is text, unlexed.
  size_t lex_raw(size_t tag, size_t body, bool& line_starting) {
    size_t p = skip_ws(skip_ws(body) + 3);
    bool strip_after_open = p < src_.size() && src_[p] == '-';
    if (strip_after_open) ++p;
    if (src_.compare(p, 2, "%}") != 0) fail_at(tag, "expected '%}' after 'raw'");
    size_t content = after_end(p + 2, strip_after_open, true, line_starting);
    for (size_t k = src_.find("{%", content); k != std::string::npos; k = src_.find("{%", k + 2)) {
      size_t q = k + 2;
      bool strip_before = q < src_.size() && src_[q] == '-';
      if (strip_before || (q < src_.size() && src_[q] == '+')) ++q;
      q = skip_ws(q);
      if (!word_at(q, "endraw")) continue;
      q = skip_ws(q + 6);
      bool strip_after = q < src_.size() && src_[q] == '-';
      if (strip_after) ++q;
      if (src_.compare(q, 2, "%}") != 0) fail_at(k, "expected '%}' after 'endraw'");
      std::string text = src_.substr(content, k - content);
      if (strip_before) {
        size_t e = text.find_last_not_of(" \t\n\r\f\v");
        text.resize(e == std::string::npos ? 0 : e + 1);
      }
      emit_text(text, content);
      return after_end(q + 2, strip_after, true, line_starting);
    }
    fail_at(tag, "unterminated '{% raw %}' block (missing '{% endraw %}')");
  }

  size_t lex_tag(char kind, size_t tag, size_t p, bool& line_starting) {
    bool block = kind == '%';
    tokens_.push_back(make(block ? Tok::block_begin : Tok::var_begin, "", tag));
    int balance = 0;
    const char* what = block ? "'{%' tag" : "'{{' expression";
    while (true) {
      while (p < src_.size() && std::isspace((unsigned char)src_[p])) ++p;
      if (p >= src_.size()) fail_at(tag, std::string("unterminated ") + what);
      char c = src_[p];
      if (balance == 0) {
        const char* close = block ? "%}" : "}}";
        bool strip = c == '-' && src_.compare(p + 1, 2, close) == 0;
        bool plus = block && c == '+' && src_.compare(p + 1, 2, close) == 0;
        if (strip || plus || src_.compare(p, 2, close) == 0) {
          size_t after = p + 2 + (strip || plus ? 1 : 0);
          tokens_.push_back(make(block ? Tok::block_end : Tok::var_end, "", p));
          return after_end(after, strip, block && !plus, line_starting);
        }
      }
      if (std::isalpha((unsigned char)c) || c == '_') {
        size_t s = p;
        while (p < src_.size() && (std::isalnum((unsigned char)src_[p]) || src_[p] == '_')) ++p;
        tokens_.push_back(make(Tok::name, src_.substr(s, p - s), s));
      } else if (std::isdigit((unsigned char)c)) {
        p = lex_number(p);
      } else if (c == '\'' || c == '"') {
        p = lex_string(p);
      } else {
        static const char* ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "/", "*", "%",
                                    "~",  "[",  "]",  "(",  ")",  "{",  "}", "<", ">", "=", ".",
                                    ":",  "|",  ",",  ";"};
        const char* hit = nullptr;
        for (const char* op : ops)
          if (src_.compare(p, std::char_traits<char>::length(op), op) == 0) {
            hit = op;
            break;
          }
        if (!hit) fail_at(p, std::string("unexpected character '") + c + "' in " + what);
        std::string op = hit;
        if (op == "(" || op == "[" || op == "{") ++balance;
        if (op == ")" || op == "]" || op == "}") {
          if (balance == 0) fail_at(p, "unbalanced '" + op + "' in " + what);
          --balance;
        }
        tokens_.push_back(make(Tok::op, op, p));
        p += op.size();
      }
    }
  }

  size_t lex_number(size_t p) {
    size_t s = p;
    auto digits = [&] {
      while (p < src_.size() && (std::isdigit((unsigned char)src_[p]) || src_[p] == '_')) ++p;
    };
    digits();
    bool real = false;
    if (p + 1 < src_.size() && src_[p] == '.' && std::isdigit((unsigned char)src_[p + 1])) {
      real = true;
      ++p;
      digits();
    }
    if (p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
      size_t q = p + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && std::isdigit((unsigned char)src_[q])) {
        real = true;
        p = q;
        digits();
      }
    }
    std::string text;
    for (size_t k = s; k < p; ++k)
      if (src_[k] != '_') text.push_back(src_[k]);
    tokens_.push_back(make(real ? Tok::real : Tok::integer, text, s));
    return p;
  }

  static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // Python string-literal escapes, as jinja2 decodes them.
  size_t lex_string(size_t p) {
    char q = src_[p];
    size_t s = p++;
    std::string out;
    while (true) {
      if (p >= src_.size()) fail_at(s, "unterminated string literal");
      char c = src_[p];
      if (c == q) break;
      if (c != '\\') {
        out.push_back(c);
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) fail_at(s, "unterminated string literal");
      char e = src_[p + 1];
      p += 2;
      switch (e) {
        case 'n': out.push_back('\n'); break;
        case 't': out.push_back('\t'); break;
        case 'r': out.push_back('\r'); break;
        case '0': out.push_back('\0'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'v': out.push_back('\v'); break;
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case '\n': break;
        case 'x': case 'u': case 'U': {
          int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          char32_t cp = 0;
          for (int k = 0; k < n; ++k) {
            int h = p + k < src_.size() ? hexval(src_[p + k]) : -1;
            if (h < 0) fail_at(p, std::string("bad \\") + e + " escape in string literal");
            cp = cp * 16 + char32_t(h);
          }
          p += size_t(n);
          utf8_append(out, cp > 0x10FFFF ? 0xFFFD : cp);
          break;
        }
        default:
          out.push_back('\\');
          out.push_back(e);
      }
    }
    tokens_.push_back(make(Tok::string, out, s));
    return p + 1;
  }

  std::string src_;
  std::vector<Token> tokens_;
  size_t line_pos_ = 0, line_start_ = 0;
  int line_ = 1;
};

}  // namespace

std::vector<Token> lex(const std::string& source) { return Lexer(source).run(); }

}  // namespace hmoe::chat
