// Random identifiers for API objects (tool call ids "call_...", completion
// ids "chatcmpl-..."), from the kernel's CSPRNG (getrandom(2)) so that ids
// never repeat across requests, restarts or processes and cannot be guessed.
//
// Thread safety: any thread.
#pragma once
#include <cstddef>
#include <string>

namespace hmoe {

// n characters of [A-Za-z0-9], uniformly drawn (rejection sampling).
std::string random_alnum(size_t n);

}  // namespace hmoe
