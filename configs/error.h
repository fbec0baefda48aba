// hmoe::Error: the one exception type that crosses module boundaries.
// Kernels and syscalls return status codes; the module boundary turns them
// into Error with a message naming the input (file, tensor, flag, field).
// The server maps Error::kind to an HTTP status.
#pragma once
#include <stdexcept>
#include <string>

namespace hmoe {

enum class ErrorKind {
  invalid_argument,  // user input: flags, env vars, request fields, token ids
  bad_model,         // model files: config, safetensors, gguf, tokenizer
  io,                // the OS said no: open, read, mmap
  unsupported,       // valid but not implemented here (dtype, architecture)
  out_of_memory,     // a placement or allocation that does not fit
  internal,          // an invariant broke: a bug
  device,            // CUDA and other accelerator failures
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& msg) : std::runtime_error(msg), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

[[noreturn]] inline void fail(ErrorKind kind, const std::string& msg) { throw Error(kind, msg); }

}  // namespace hmoe
