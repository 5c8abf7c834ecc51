// The draft-model drafter: a second, smaller model with the target's
// vocabulary guesses the next tokens greedily. It runs on a CPU runner of its
// own (model/executor.h) over a paged KV cache of its own, one block table per
// target sequence, in step with the target: what the target rejected is
// rolled back, what it accepted is caught up in the next draft pass, and
// every sequence drafts in the same forward passes.
#pragma once

#include <cstdint>
#include <memory>

#include "engine/speculation.h"

namespace tandem {

class Model;
class ThreadPool;

// Throws Error(kInvalidArgument) naming the first difference when the two
// vocabularies differ (size, special tokens, a token's text).
std::unique_ptr<Drafter> make_draft_model_drafter(const Model& target, Model& draft, const SpecConfig& cfg,
                                                  int32_t max_context, int32_t max_seqs, ThreadPool& pool);

}  // namespace tandem
