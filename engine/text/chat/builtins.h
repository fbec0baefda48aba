// Helpers shared by the filter, test, method and global-function tables.
#pragma once
#include <string>

#include "engine/text/chat/interpreter.h"

namespace hmoe::chat {

// Positional-or-keyword argument access with Python-style errors.
class ArgReader {
 public:
  ArgReader(CallArgs& args, std::string fn) : args_(args), fn_(std::move(fn)) {}
  // The argument at `pos` (positional) or named `name`; nullptr if absent.
  const Value* get(size_t pos, const char* name) const;
  std::string str(size_t pos, const char* name, const std::string& dflt) const;
  int64_t integer(size_t pos, const char* name, int64_t dflt) const;
  bool boolean(size_t pos, const char* name, bool dflt) const;
  const Value& required(size_t pos, const char* name) const;
  void max_positional(size_t n) const;
  const std::string& fn() const { return fn_; }

 private:
  CallArgs& args_;
  std::string fn_;
};

// Names the filter and test tables implement (the parser rejects others, as
// jinja2 does at compile time).
bool known_filter(std::string_view name);
bool known_test(std::string_view name);

// attribute paths as filters take them ("a.b", "0"): dict item or attribute.
Value lookup_path(Interpreter& in, const Value& v, const std::string& path);

}  // namespace hmoe::chat
