// Errors at Tandem's boundaries. Code below the file reader, tokenizer and
// CLI/HTTP layers throws tandem::Error with a message that names the offending
// key, tensor, field or value; the boundary catches it and reports it. Nothing
// aborts on user input.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace tandem {

enum class ErrorKind {
  kInvalidFile,      // malformed or unsupported model file
  kInvalidArgument,  // bad user input (CLI flag, request field, prompt)
  kUnsupported,      // valid input that Tandem does not implement
  kIo,               // the OS refused (open, mmap, write)
  kResource,         // out of memory, context full
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& msg) : std::runtime_error(msg), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

template <typename... Args>
[[noreturn]] void fail(ErrorKind kind, fmt::format_string<Args...> f, Args&&... args) {
  throw Error(kind, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace tandem
