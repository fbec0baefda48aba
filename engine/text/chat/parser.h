// Parses lexer tokens into the syntax tree. Errors throw
// hmoe::Error(bad_model) as "chat template LINE:COL: what (in 'construct')".
#pragma once
#include <string>

#include "engine/text/chat/ast.h"

namespace hmoe::chat {

Body parse_template(const std::string& source);

}  // namespace hmoe::chat
