// A request's choice as a Sequence: its own sampler (a seed of its own per
// choice), text decoder and JSON constraint.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/sequence.h"

namespace tandem {

class Tokenizer;

class SequenceFactory {
 public:
  explicit SequenceFactory(const Tokenizer& tok) : tok_(tok) {}
  // Thread-safe. Throws Error(kInvalidArgument) for a JSON schema it cannot follow.
  std::unique_ptr<Sequence> make(const std::shared_ptr<RequestState>& req, int32_t choice);

 private:
  const Tokenizer& tok_;
  // Every token's text, made at the first constrained request.
  std::once_flag pieces_once_;
  std::shared_ptr<const std::vector<std::string>> pieces_;
};

}  // namespace tandem
