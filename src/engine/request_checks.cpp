#include "engine/request_checks.h"

#include "core/error.h"
#include "engine/sampler.h"

namespace tandem {

void check_request(std::span<const int32_t> prompt, const RequestParams& params, int32_t nv, int32_t max_context,
                   bool streaming_window) {
  if (prompt.empty()) fail(ErrorKind::kInvalidArgument, "the prompt is empty");
  for (int32_t t : prompt)
    if (t < 0 || t >= nv) fail(ErrorKind::kInvalidArgument, "prompt token id {} is outside the vocabulary (0..{})", t, nv - 1);
  // A prompt alone (max_tokens 0: scored, not continued) may fill the
  // context; a streaming window slides through any prompt.
  if (!streaming_window &&
      (static_cast<int64_t>(prompt.size()) > max_context ||
       (static_cast<int64_t>(prompt.size()) == max_context && params.max_tokens != 0)))
    fail(ErrorKind::kInvalidArgument,
         "the prompt has {} tokens, which leaves no room in the context of {} tokens", prompt.size(), max_context);
  if (params.n < 1 || params.n > kMaxChoices)
    fail(ErrorKind::kInvalidArgument, "n = {} is outside [1, {}]", params.n, kMaxChoices);
  if (params.logprobs > 20) fail(ErrorKind::kInvalidArgument, "logprobs = {} is more than 20", params.logprobs);
  if (params.prompt_logprobs > 20)
    fail(ErrorKind::kInvalidArgument, "prompt_logprobs = {} is more than 20", params.prompt_logprobs);
  if (params.on_prompt_row && (params.prompt_logprobs >= 0 || params.rows_from < 0 ||
                               params.rows_from >= static_cast<int32_t>(prompt.size())))
    fail(ErrorKind::kInvalidArgument, "prompt rows from {} of a {}-token prompt cannot be scored", params.rows_from,
         prompt.size());
  for (const auto& [id, bias] : params.sampling.logit_bias)
    if (id < 0 || id >= nv)
      fail(ErrorKind::kInvalidArgument, "logit_bias token id {} is outside the vocabulary (0..{})", id, nv - 1);
  Sampler check(params.sampling);  // throws on absurd sampling parameters
}

}  // namespace tandem
