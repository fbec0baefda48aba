// Python str methods on UTF-8 strings (code-point semantics where Python's
// differ from byte semantics: strip sets, whitespace, case of ASCII only).
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace hmoe::chat {

// chars == nullptr: Python whitespace.
std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right);
std::vector<std::string> py_split(std::string_view s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> py_rsplit(std::string_view s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> py_splitlines(std::string_view s, bool keepends);
std::string py_replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count);
std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
std::string py_capitalize(std::string_view s);
std::string py_title(std::string_view s);
int64_t py_count(std::string_view s, std::string_view sub);

}  // namespace hmoe::chat
