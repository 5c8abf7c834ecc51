#include "convert/llama2c.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"

namespace tandem {
namespace {

// llama2.c's export.py "version 1+" files start with this magic instead of the
// legacy header; they carry different layouts (and int8 weights for v2).
constexpr uint32_t kVersionedMagic = 0x616b3432;  // "ak42"

// tokenizer.ggml.token_type values.
constexpr int32_t kNormal = 1, kUnknown = 2, kControl = 3, kByte = 6;

std::vector<uint8_t> read_file(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) fail(ErrorKind::kIo, "{}: cannot read: {}", path, ec.message());
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorKind::kIo, "{}: cannot open: {}", path, std::strerror(errno));
  std::vector<uint8_t> data(static_cast<size_t>(size));
  if (size > 0 && !in.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(size)))
    fail(ErrorKind::kIo, "{}: read failed", path);
  return data;
}

struct Config {
  int64_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
  bool shared_classifier;
  int64_t head_size() const { return dim / n_heads; }
  int64_t kv_dim() const { return n_kv_heads * head_size(); }
};

std::string describe(const Config& c) {
  return fmt::format("dim={} hidden_dim={} n_layers={} n_heads={} n_kv_heads={} vocab_size={} "
                     "seq_len={}",
                     c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads,
                     c.shared_classifier ? c.vocab_size : -c.vocab_size, c.seq_len);
}

Config parse_header(const std::vector<uint8_t>& f, const std::string& path) {
  if (f.size() < 7 * sizeof(int32_t))
    fail(ErrorKind::kInvalidFile, "{}: file truncated: {} bytes, a llama2.c header needs 28", path,
         f.size());
  int32_t h[7];
  std::memcpy(h, f.data(), sizeof h);
  if (static_cast<uint32_t>(h[0]) == kVersionedMagic)
    fail(ErrorKind::kUnsupported,
         "{}: llama2.c versioned export (magic \"ak42\"); only the legacy format is supported "
         "(export with --version 0)",
         path);
  const char* names[] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size",
                         "seq_len"};
  for (int i = 0; i < 7; ++i) {
    // vocab_size is negative when the classifier is stored separately.
    const bool ok = i == 5 ? (h[i] != 0 && h[i] != std::numeric_limits<int32_t>::min()) : h[i] > 0;
    if (!ok)
      fail(ErrorKind::kInvalidFile, "{}: header field {} = {} is invalid (not a llama2.c checkpoint?)",
           path, names[i], h[i]);
  }
  Config c{h[0], h[1], h[2], h[3], h[4], std::abs(int64_t{h[5]}), h[6], h[5] > 0};
  if (c.dim % c.n_heads != 0)
    fail(ErrorKind::kInvalidFile, "{}: header dim {} is not a multiple of n_heads {}", path, c.dim,
         c.n_heads);
  if (c.n_kv_heads > c.n_heads || c.n_heads % c.n_kv_heads != 0)
    fail(ErrorKind::kInvalidFile, "{}: header n_heads {} is not a multiple of n_kv_heads {}", path,
         c.n_heads, c.n_kv_heads);
  if (c.head_size() % 2 != 0)
    fail(ErrorKind::kInvalidFile, "{}: head size {} (dim/n_heads) is odd; RoPE needs pairs", path,
         c.head_size());
  return c;
}

// One weight array in the file, in llama2.c order.
struct Slice {
  std::string name;           // GGUF tensor name; empty for skipped arrays
  std::vector<int64_t> dims;  // ggml order, ne0 = input dimension
  uint64_t offset = 0;        // byte offset in the .bin
};

// Lays out the weights as llama2.c's memory_map_weights reads them; each
// per-layer array holds all layers back to back. Returns the total file size
// (UINT64_MAX on overflow). Slices are only listed when `out` is given, which
// callers do after checking the size, so a header claiming 2^31 layers cannot
// make us allocate for them.
uint64_t layout(const Config& c, std::vector<Slice>* out) {
  uint64_t off = 7 * sizeof(int32_t);
  auto add = [&](auto name_of, std::vector<int64_t> dims, int64_t copies) {
    // Header values are int32, so dim * hidden * layers can exceed 2^64.
    uint64_t per = 4, all = 0;
    bool overflow = false;
    for (int64_t d : dims) overflow |= __builtin_mul_overflow(per, static_cast<uint64_t>(d), &per);
    overflow |= __builtin_mul_overflow(per, static_cast<uint64_t>(copies), &all);
    if (overflow || off == UINT64_MAX || __builtin_add_overflow(off, all, &off)) {
      off = UINT64_MAX;
      return;
    }
    if (out)
      for (int64_t l = 0; l < copies; ++l)
        out->push_back({name_of(l), dims, off - all + static_cast<uint64_t>(l) * per});
  };
  auto global = [](const char* n) { return [n](int64_t) { return std::string(n); }; };
  auto layer = [](const char* n) {
    return [n](int64_t l) { return fmt::format("blk.{}.{}.weight", l, n); };
  };
  const int64_t L = c.n_layers, D = c.dim, H = c.hidden_dim, Q = c.n_heads * c.head_size();
  add(global("token_embd.weight"), {D, c.vocab_size}, 1);
  add(layer("attn_norm"), {D}, L);
  add(layer("attn_q"), {D, Q}, L);
  add(layer("attn_k"), {D, c.kv_dim()}, L);
  add(layer("attn_v"), {D, c.kv_dim()}, L);
  add(layer("attn_output"), {Q, D}, L);
  add(layer("ffn_norm"), {D}, L);
  add(layer("ffn_gate"), {D, H}, L);
  add(layer("ffn_down"), {H, D}, L);
  add(layer("ffn_up"), {D, H}, L);
  add(global("output_norm.weight"), {D}, 1);
  // freq_cis_real and freq_cis_imag: RoPE tables that llama2.c skips.
  add(global(""), {c.seq_len, c.head_size() / 2}, 2);
  if (!c.shared_classifier) add(global("output.weight"), {D, c.vocab_size}, 1);
  return off;
}

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
};

bool is_byte_piece(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return false;
  return std::isxdigit(static_cast<unsigned char>(t[3])) &&
         std::isxdigit(static_cast<unsigned char>(t[4]));
}

// llama2.c's tokenizer.bin stores pieces with SentencePiece's U+2581 turned
// into spaces and BOS/EOS as "\n<s>\n"/"\n</s>\n"; GGUF wants the SentencePiece
// form, as llama.cpp's converter restores it.
Vocab read_tokenizer(const std::string& path, int64_t n_vocab) {
  const std::vector<uint8_t> f = read_file(path);
  uint64_t pos = 0;
  auto need = [&](uint64_t n, int64_t tok, const char* what) {
    if (n > f.size() - pos)
      fail(ErrorKind::kInvalidFile,
           "{}: file truncated: token {} {} at offset {} needs {} bytes, {} remain (the model "
           "has {} tokens)",
           path, tok, what, pos, n, f.size() - pos, n_vocab);
  };
  need(4, -1, "max_token_length");
  int32_t max_len;
  std::memcpy(&max_len, f.data(), 4);
  pos = 4;
  if (max_len <= 0)
    fail(ErrorKind::kInvalidFile, "{}: max_token_length {} is invalid (not a llama2.c tokenizer?)",
         path, max_len);

  Vocab v;
  for (int64_t i = 0; i < n_vocab; ++i) {
    float score;
    int32_t len;
    need(8, i, "score and length");
    std::memcpy(&score, f.data() + pos, 4);
    std::memcpy(&len, f.data() + pos + 4, 4);
    pos += 8;
    if (len < 0 || len > max_len)
      fail(ErrorKind::kInvalidFile, "{}: token {} has length {} (max_token_length is {})", path, i,
           len, max_len);
    if (!std::isfinite(score))
      fail(ErrorKind::kInvalidFile, "{}: token {} has a non-finite score", path, i);
    need(static_cast<uint64_t>(len), i, "text");
    std::string text(reinterpret_cast<const char*>(f.data() + pos), static_cast<size_t>(len));
    pos += static_cast<uint64_t>(len);

    int32_t type = kNormal;
    if (i == 0) {
      text = "<unk>";
      type = kUnknown;
    } else if (i == 1 || i == 2) {
      text = i == 1 ? "<s>" : "</s>";
      type = kControl;
    } else if (is_byte_piece(text)) {
      type = kByte;
    }
    std::string piece;
    for (char ch : text) {
      if (ch == ' ') piece += "\xe2\x96\x81";  // U+2581
      else piece += ch;
    }
    v.tokens.push_back(std::move(piece));
    v.scores.push_back(score);
    v.types.push_back(type);
  }
  if (pos != f.size())
    fail(ErrorKind::kInvalidFile,
         "{}: {} bytes left after {} tokens: the tokenizer does not match the model's vocab_size",
         path, f.size() - pos, n_vocab);
  return v;
}

}  // namespace

void convert_llama2c(const std::string& model_bin, const std::string& tokenizer_bin,
                     const std::string& out_gguf) {
  const std::vector<uint8_t> bin = read_file(model_bin);
  const Config c = parse_header(bin, model_bin);
  const uint64_t expect = layout(c, nullptr);
  if (expect != bin.size())
    fail(ErrorKind::kInvalidFile,
         "{}: file has {} bytes but its header ({}) implies {}{}", model_bin, bin.size(),
         describe(c), expect == UINT64_MAX ? std::string("more than 2^64") : std::to_string(expect),
         bin.size() < expect ? " (truncated file?)" : " (inconsistent header or not a legacy llama2.c file)");

  std::vector<Slice> slices;
  layout(c, &slices);
  const Vocab vocab = read_tokenizer(tokenizer_bin, c.vocab_size);

  GgufWriter w;
  std::string name = std::filesystem::path(model_bin).stem().string();
  if (name.empty()) name = "llama";
  w.add_string("general.architecture", "llama");
  w.add_string("general.name", name);
  w.add_u32("llama.context_length", static_cast<uint32_t>(c.seq_len));
  w.add_u32("llama.embedding_length", static_cast<uint32_t>(c.dim));
  w.add_u32("llama.feed_forward_length", static_cast<uint32_t>(c.hidden_dim));
  w.add_u32("llama.attention.head_count", static_cast<uint32_t>(c.n_heads));
  w.add_u32("llama.attention.head_count_kv", static_cast<uint32_t>(c.n_kv_heads));
  w.add_u32("llama.block_count", static_cast<uint32_t>(c.n_layers));
  w.add_u32("llama.rope.dimension_count", static_cast<uint32_t>(c.head_size()));
  w.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_string_array("tokenizer.ggml.tokens", vocab.tokens);
  w.add_f32_array("tokenizer.ggml.scores", vocab.scores);
  w.add_i32_array("tokenizer.ggml.token_type", vocab.types);
  w.add_u32("tokenizer.ggml.unknown_token_id", 0);
  w.add_u32("tokenizer.ggml.bos_token_id", 1);
  w.add_u32("tokenizer.ggml.eos_token_id", 2);

  auto find = [&](const std::string& n) -> const Slice& {
    for (const auto& s : slices)
      if (s.name == n) return s;
    fail(ErrorKind::kInvalidFile, "internal: no slice {}", n);
  };
  auto add = [&](const std::string& tensor_name, const Slice& s) {
    uint64_t n = 4;
    for (int64_t d : s.dims) n *= static_cast<uint64_t>(d);
    w.add_tensor(tensor_name, GgmlType::F32, s.dims,
                 std::vector<uint8_t>(bin.begin() + static_cast<std::ptrdiff_t>(s.offset),
                                      bin.begin() + static_cast<std::ptrdiff_t>(s.offset + n)));
  };
  // Tensor order follows llama.cpp's converter; the classifier is written
  // explicitly even when llama2.c shares it with the embedding.
  add("token_embd.weight", find("token_embd.weight"));
  add("output_norm.weight", find("output_norm.weight"));
  add("output.weight", find(c.shared_classifier ? "token_embd.weight" : "output.weight"));
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (const char* t : {"attn_q", "attn_k", "attn_v", "attn_output", "attn_norm", "ffn_gate",
                          "ffn_down", "ffn_up", "ffn_norm"}) {
      const std::string n = fmt::format("blk.{}.{}.weight", l, t);
      add(n, find(n));
    }
  w.write(out_gguf);
}

}  // namespace tandem
