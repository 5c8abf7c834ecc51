// HTTP/1.1 requests as RFC 9112 defines them, parsed strictly: a request
// head, and a chunked body decoded as it arrives. Anything a proxy and this
// server could read two ways (Transfer-Encoding beside Content-Length, two
// different lengths, folded or control bytes in a header, a bare CR or LF)
// is an error, so no request can be smuggled past a front end. No I/O here:
// the connection code feeds bytes in, and all of it is unit-tested and fuzzed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::server::http {

struct ParseError {
  int status = 400;     // 400, 413, 431, 501 or 505
  std::string message;  // says what was wrong, for the error body
};

struct HeadLimits {
  size_t max_head_bytes = 16 << 10;  // request line and headers together
  size_t max_headers = 100;
};

struct Header {
  std::string name;   // lower case
  std::string value;  // without surrounding spaces
};

struct RequestHead {
  std::string method;   // as sent (methods are case-sensitive)
  std::string target;   // origin-form ("/v1/models?x=1") or "*"
  std::string path;     // target up to '?'
  int minor_version = 1;  // HTTP/1.<minor>: 0 or 1
  std::vector<Header> headers;

  // Framing, derived from the headers.
  bool chunked = false;
  int64_t content_length = 0;  // 0 when neither header is present
  bool keep_alive = true;      // HTTP/1.1 unless "Connection: close"; 1.0 only with "keep-alive"
  bool expect_continue = false;

  // The first header of that (lower-case) name, or nullptr.
  const std::string* find(std::string_view name) const;
};

enum class Parse { kIncomplete, kDone, kError };

// Parses the head at the start of `buf`: kDone sets `consumed` to its length
// (the body, or the next pipelined request, follows); kIncomplete while no
// blank line has come and the limits still allow one.
Parse parse_head(std::string_view buf, const HeadLimits& lim, RequestHead& out, size_t& consumed, ParseError& err);

// A chunked body, decoded piece by piece as bytes arrive. Chunk extensions
// and trailer fields are read and dropped; their lines are bounded.
class ChunkedDecoder {
 public:
  explicit ChunkedDecoder(size_t max_body) : max_body_(max_body) {}
  // Consumes what it can of `in` (`consumed` bytes), appending the data to
  // `out`. kDone once the last chunk and the trailers are in: the bytes after
  // them are left unconsumed (a pipelined request). kError when the framing
  // is broken, or 413 when the decoded body would pass max_body.
  Parse feed(std::string_view in, size_t& consumed, std::string& out, ParseError& err);
  size_t decoded() const { return decoded_; }

 private:
  enum class State { kSize, kData, kDataEnd, kTrailer, kDone };
  State state_ = State::kSize;
  size_t max_body_;
  size_t decoded_ = 0;
  uint64_t remaining_ = 0;  // of the current chunk
  int trailers_ = 0;
  std::string line_;        // a size or trailer line not yet complete
};

// Status line text for a code ("Not Found").
std::string_view reason_phrase(int status);

}  // namespace tandem::server::http
