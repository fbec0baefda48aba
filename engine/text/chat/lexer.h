// Jinja2 lexer with the whitespace rules transformers renders with:
// trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False, and the
// `-`/`+` markers on tags. Text between tags comes out already trimmed, so the
// parser and interpreter never think about whitespace.
#pragma once
#include <string>
#include <vector>

namespace hmoe::chat {

enum class Tok : uint8_t {
  text,         // literal template text
  var_begin,    // {{
  var_end,      // }}
  block_begin,  // {%
  block_end,    // %}
  name,
  string,       // value: the unescaped string
  integer,
  real,
  op,           // value: the operator, e.g. "==", "(", "|"
  eof,
};

struct Token {
  Tok kind;
  std::string value;
  int line;
  int col;
};

// Throws hmoe::Error(bad_model) with line:col on an unterminated tag,
// comment or string, or an unexpected character.
std::vector<Token> lex(const std::string& source);

}  // namespace hmoe::chat
