#include "engine/sequence_factory.h"

#include "engine/json_grammar.h"
#include "engine/tool_call_grammar.h"
#include "tokenizer/tokenizer.h"

namespace tandem {

std::unique_ptr<Sequence> SequenceFactory::make(const std::shared_ptr<RequestState>& req, int32_t choice) {
  auto s = std::make_unique<Sequence>();
  s->req = req;
  s->choice = choice;
  SamplingParams sp = req->params.sampling;
  if (sp.seed != 0xFFFFFFFF) sp.seed += static_cast<uint64_t>(choice);  // distinct, reproducible choices
  s->sampler = std::make_unique<Sampler>(sp);
  s->decoder = std::make_unique<StreamDecoder>(tok_);
  if (req->params.json_object || req->params.json_schema) {
    std::call_once(pieces_once_, [this] { pieces_ = token_pieces(tok_); });
    s->json = std::make_unique<JsonConstraint>(pieces_, tok_, req->params.json_schema);
  } else if (req->params.tool_calls) {
    std::call_once(pieces_once_, [this] { pieces_ = token_pieces(tok_); });
    s->json = std::make_unique<ToolCallConstraint>(pieces_, tok_, req->params.tool_calls);
  }
  return s;
}

}  // namespace tandem
