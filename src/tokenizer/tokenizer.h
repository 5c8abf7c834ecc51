// Text <-> token ids from a GGUF vocabulary, matching llama.cpp's tokenizer.
//   SPM ("llama"): SentencePiece-style merges by score, byte fallback <0xNN>.
//   BPE ("gpt2"):  byte-level BPE over pre-tokenized words, ranked merges; the
//                  pre-tokenizer regexes are chosen by tokenizer.ggml.pre.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem {

class GgufFile;

enum class TokenType : int32_t {  // tokenizer.ggml.token_type values
  kUndefined = 0, kNormal = 1, kUnknown = 2, kControl = 3,
  kUserDefined = 4, kUnused = 5, kByte = 6,
};

class Tokenizer {
 public:
  // Reads tokenizer.ggml.* keys; works on vocab-only files (no tensors).
  // Throws tandem::Error naming a missing/invalid key or an unknown model/pre.
  static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& f);
  virtual ~Tokenizer() = default;

  // add_special: prepend BOS / append EOS as the vocab's add_bos/add_eos rules say.
  // parse_special: text matching a control token string (e.g. "<start_of_turn>")
  // becomes that token instead of being tokenized as text. User-defined tokens
  // are matched either way, as llama.cpp does.
  // `literal` ranges (offset, length) of the text never become control
  // tokens, even with parse_special: a chat's message content, inside markup
  // whose control tokens do.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special,
                                      std::span<const std::pair<size_t, size_t>> literal = {}) const = 0;
  // The longest text any one token stands for, in bytes: a text of N bytes
  // has at least N / max_token_bytes() tokens, which bounds a prompt's length
  // before it is tokenized.
  virtual size_t max_token_bytes() const = 0;
  // The raw bytes a token stands for (may be part of a UTF-8 character).
  // Control tokens give "" unless `render_special` is true. An id outside the
  // vocab throws tandem::Error.
  virtual std::string token_to_piece(int32_t id, bool render_special = false) const = 0;
  // llama.cpp's llama_detokenize(remove_special = false): the pieces joined.
  std::string decode(const std::vector<int32_t>& ids, bool render_special = false) const;
  // The text the tokens spell as a client reads it back: control tokens
  // spell nothing, and the first visible piece loses the space the
  // tokenizer put in front of the text (SentencePiece's prefix), so a
  // prompt's ids spell the prompt. With `offsets`, where each token starts.
  virtual std::string spell(const std::vector<int32_t>& ids, std::vector<size_t>* offsets = nullptr) const = 0;

  virtual int32_t n_vocab() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 when none
  virtual int32_t eos_id() const = 0;  // -1 when none
  virtual bool add_bos() const = 0;
  // End-of-generation: EOS, EOT and any other token the vocab marks as such
  // (e.g. gemma's <end_of_turn>, llama-3's <|eot_id|>, chatml's <|im_end|>).
  virtual bool is_eog(int32_t id) const = 0;
  // The id of an exact token string, -1 when absent.
  virtual int32_t find_token(std::string_view piece) const = 0;

 protected:
  // decode() delegates here. The default concatenates token_to_piece; the
  // GGUF tokenizer also applies llama.cpp's detokenize rules (first-token space
  // strip when add_space_prefix, clean_up_tokenization_spaces for BPE).
  virtual std::string detokenize(const std::vector<int32_t>& ids, bool render_special) const;
};

// Turns a stream of token ids into text that never ends in half a UTF-8
// character: bytes of an incomplete character are held back until it completes.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok) : tok_(tok) {}
  // Text completed by this token; bytes that can never form a character come
  // out as U+FFFD, so the result is always valid UTF-8.
  std::string push(int32_t id);
  std::string flush();  // whatever is held back, as U+FFFD

 private:
  const Tokenizer& tok_;
  std::string pending_;
};

}  // namespace tandem
