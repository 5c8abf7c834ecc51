#include "convert/quantize.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>

#include <fmt/format.h>

#include "core/error.h"
#include "quant/quant.h"
#include "runtime/thread_pool.h"
#include "gguf/gguf.h"

namespace tandem {
namespace {

// llama_ftype numbers (llama.h).
enum Ftype : uint32_t {
  kAllF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ8_0 = 7, kQ5_0 = 8, kQ5_1 = 9, kQ2_K = 10,
  kQ3_K_S = 11, kQ3_K_M = 12, kQ3_K_L = 13, kQ4_K_S = 14, kQ4_K_M = 15, kQ5_K_S = 16,
  kQ5_K_M = 17, kQ6_K = 18, kBF16 = 32, kMXFP4_MOE = 38,
};

// llama-quantize's list (the K-quant mixes also put the output matrix, or a
// tied token embedding, in Q6_K), less the types Tandem has no format for (IQ*, TQ*,
// NVFP4, Q1_0, Q2_0) and Q2_K_S (which needs an importance matrix). The
// aliases Q3_K, Q4_K, Q5_K come right before their _M mix.
const std::vector<QuantizeType> kTypes = {
    {"Q4_0", kQ4_0, GgmlType::Q4_0, "4.5 bpw: 32-element blocks, an f16 scale"},
    {"Q4_1", kQ4_1, GgmlType::Q4_1, "5.0 bpw: 32-element blocks, f16 scale and minimum"},
    {"Q5_0", kQ5_0, GgmlType::Q5_0, "5.5 bpw: 32-element blocks, an f16 scale"},
    {"Q5_1", kQ5_1, GgmlType::Q5_1, "6.0 bpw: 32-element blocks, f16 scale and minimum"},
    {"Q2_K", kQ2_K, GgmlType::Q2_K, "Q2_K (2.625 bpw); attn_v, attn_output, ffn_down in Q3_K/Q4_K"},
    {"Q3_K", kQ3_K_M, GgmlType::Q3_K, "alias for Q3_K_M"},
    {"Q3_K_S", kQ3_K_S, GgmlType::Q3_K, "Q3_K (3.4375 bpw) throughout"},
    {"Q3_K_M", kQ3_K_M, GgmlType::Q3_K, "Q3_K; attn_v, attn_output, ffn_down in Q4_K/Q5_K"},
    {"Q3_K_L", kQ3_K_L, GgmlType::Q3_K, "Q3_K; attn_v, attn_output, ffn_down in Q5_K"},
    {"Q4_K", kQ4_K_M, GgmlType::Q4_K, "alias for Q4_K_M"},
    {"Q4_K_S", kQ4_K_S, GgmlType::Q4_K, "Q4_K (4.5 bpw); Q5_K for the first attn_v and ffn_down"},
    {"Q4_K_M", kQ4_K_M, GgmlType::Q4_K, "Q4_K; Q6_K for half of attn_v and ffn_down"},
    {"Q5_K", kQ5_K_M, GgmlType::Q5_K, "alias for Q5_K_M"},
    {"Q5_K_S", kQ5_K_S, GgmlType::Q5_K, "Q5_K (5.5 bpw) throughout"},
    {"Q5_K_M", kQ5_K_M, GgmlType::Q5_K, "Q5_K; Q6_K for half of attn_v and ffn_down"},
    {"Q6_K", kQ6_K, GgmlType::Q6_K, "6.5625 bpw"},
    {"Q8_0", kQ8_0, GgmlType::Q8_0, "8.5 bpw: 32-element blocks, an f16 scale"},
    {"F16", kF16, GgmlType::F16, "16 bpw, IEEE half"},
    {"BF16", kBF16, GgmlType::BF16, "16 bpw, bfloat16"},
    {"F32", kAllF32, GgmlType::F32, "32 bpw"},
    {"MXFP4_MOE", kMXFP4_MOE, GgmlType::MXFP4, "MXFP4 (4.25 bpw) for the expert tensors, Q8_0 for the rest"},
};

std::string lower(std::string_view s) {
  std::string r;
  for (char c : s) r += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

bool is_quantized(GgmlType t) { return type_traits(t).block_elems > 1; }

// ---------------------------------------------------------------------------
// What llama.cpp reads from the metadata for its choices (hparams).

struct ModelFacts {
  std::string arch;
  int n_layer = 0;
  int n_head = 0, n_head_kv = 0;
  int n_expert = 0;
  bool is_70b = false;
  int n_gqa() const { return n_head_kv == 0 ? 0 : n_head / n_head_kv; }
};

// A u32 key, or the first element of a per-layer array (llama.cpp's get_key_or_arr).
std::optional<int64_t> int_or_first(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.find(key);
  if (v == nullptr) return std::nullopt;
  if (v->type == GgufType::ARRAY) {
    auto a = f.get_int_array(key);
    if (!a || a->empty()) return std::nullopt;
    return (*a)[0];
  }
  return f.get_int(key);
}

ModelFacts model_facts(const GgufFile& f) {
  ModelFacts m;
  m.arch = f.get_string("general.architecture").value_or("");
  const std::string a = m.arch + ".";
  m.n_layer = static_cast<int>(f.get_int(a + "block_count").value_or(0));
  m.n_head = static_cast<int>(int_or_first(f, a + "attention.head_count").value_or(0));
  m.n_head_kv = static_cast<int>(int_or_first(f, a + "attention.head_count_kv").value_or(m.n_head));
  m.n_expert = static_cast<int>(f.get_int(a + "expert_count").value_or(0));
  // llama.cpp's LLM_TYPE_70B, the one model size its rules look at.
  if (m.arch == "llama") m.is_70b = m.n_layer == 80 && m.n_head != m.n_head_kv;
  if (m.arch == "qwen2" || m.arch == "deci" || m.arch == "olmo") m.is_70b = m.n_layer == 80;
  if (m.arch == "jais2") m.is_70b = m.n_layer == 68;
  return m;
}

// ---------------------------------------------------------------------------
// Tensor names.

enum class Category { kTokenEmbd, kAttnQ, kAttnV, kAttnK, kAttnQkv, kAttnKvB, kAttnOutput, kFfnUp, kFfnGate, kFfnDown, kOutput, kOther };

bool contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

Category category_of(const std::string& n) {
  if (n == "output.weight") return Category::kOutput;
  if (n == "token_embd.weight" || n == "per_layer_token_embd.weight") return Category::kTokenEmbd;
  if (contains(n, "attn_qkv.weight")) return Category::kAttnQkv;
  if (contains(n, "attn_kv_b.weight")) return Category::kAttnKvB;
  if (contains(n, "attn_v.weight")) return Category::kAttnV;
  if (contains(n, "attn_k.weight")) return Category::kAttnK;
  if (contains(n, "attn_q.weight")) return Category::kAttnQ;
  if (contains(n, "attn_output.weight")) return Category::kAttnOutput;
  if (contains(n, "ffn_up")) return Category::kFfnUp;
  if (contains(n, "ffn_gate")) return Category::kFfnGate;
  if (contains(n, "ffn_down")) return Category::kFfnDown;
  return Category::kOther;
}

bool is_attn_v_like(Category c) { return c == Category::kAttnV || c == Category::kAttnQkv || c == Category::kAttnKvB; }

// ggml_n_dims: trailing dimensions of 1 do not count.
int n_dims(const std::vector<int64_t>& dims) {
  int n = static_cast<int>(dims.size());
  while (n > 1 && dims[static_cast<size_t>(n) - 1] == 1) --n;
  return n;
}

// llama.cpp's tensor_allows_quantization, for the architectures' generic names
// (GLM-5-next's own exclusions are left out: Tandem cannot read such files).
bool allows_quantization(const std::string& name, const std::vector<int64_t>& dims, const QuantizeOptions& o) {
  if (n_dims(dims) < 2) return false;
  if (!name.ends_with("weight")) return false;
  if (contains(name, "_norm.weight")) return false;
  if (o.leave_output_tensor && name == "output.weight") return false;
  static constexpr std::string_view kNever[] = {
      "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel", "per_layer_model_proj",
      "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight",
      "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight",
      "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight",
      "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight", "time_mix_g2.weight",
      "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight",
      "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos",
      ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd"};
  for (std::string_view part : kNever)
    if (contains(name, part)) return false;
  if (name == "position_embd.weight" || name == "token_types.weight") return false;
  return true;
}

// The layer of "blk.N.…" as llama.cpp's sscanf("blk.%d.") reads it; -1 otherwise.
int layer_of(const std::string& name) {
  if (!name.starts_with("blk.")) return -1;
  const char* p = name.c_str() + 4;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(p, &end, 10);
  if (end == p || errno != 0 || v < INT32_MIN || v > INT32_MAX) return -1;
  return static_cast<int>(v);
}

// llama.cpp's llama_model_loader keeps tensors in a map ordered this way, and
// llama-quantize writes them in that order.
bool output_order(const std::string& a, const std::string& b) {
  const int la = layer_of(a), lb = layer_of(b);
  if (la != lb) return la < lb;
  return a < b;
}

// ---------------------------------------------------------------------------
// The type rules (llama_tensor_get_type_impl) for the mixes Tandem makes.

struct MixState {
  const ModelFacts& m;
  uint32_t ftype;
  bool tied;  // no output.weight: token_embd doubles as the output matrix
  int n_attention_wv = 0, i_attention_wv = 0;
  int i_ffn_down = 0, i_ffn_gate = 0, i_ffn_up = 0;
};

bool use_more_bits(int i_layer, int n_layers) {
  return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2;
}

// The layer a ffn tensor counts as: its position among its kind, or, in a
// mixture-of-experts model (whose experts llama.cpp does not count in
// order), the number in its name.
int ffn_layer(const MixState& s, int counter, const std::string& name) {
  if (s.m.n_expert <= 1) return counter;
  const int l = layer_of(name);
  if (l < 0) fail(ErrorKind::kInvalidFile, "quantize: cannot tell the layer of tensor '{}'", name);
  if (l >= s.m.n_layer)
    fail(ErrorKind::kInvalidFile, "quantize: tensor '{}' is in layer {}, but the model has {}", name, l, s.m.n_layer);
  return l;
}

GgmlType mix_type(MixState& s, GgmlType t, const std::string& name, const std::vector<int64_t>& dims,
                  Category cat) {
  const uint32_t ft = s.ftype;
  const bool falcon = s.m.arch == "falcon";
  const int n_layer = s.m.n_layer;
  const int64_t ne0 = dims[0];
  if (cat == Category::kOutput || (s.tied && cat == Category::kTokenEmbd)) {
    if (ft == kMXFP4_MOE)
      t = GgmlType::Q8_0;
    else if (falcon || ne0 % type_traits(t).block_elems != 0)
      t = GgmlType::Q8_0;
    else if (t != GgmlType::Q8_0)
      t = GgmlType::Q6_K;
  } else if (ft == kMXFP4_MOE) {
    // The experts (3-D: one matrix per expert) in MXFP4, everything else in Q8_0.
    t = dims.size() > 2 && dims[2] > 1 ? GgmlType::MXFP4 : GgmlType::Q8_0;
  } else if (cat == Category::kTokenEmbd) {
    // no rule for the types made here
  } else if (is_attn_v_like(cat)) {
    if (ft == kQ2_K)
      t = s.m.n_gqa() >= 4 ? GgmlType::Q4_K : GgmlType::Q3_K;
    else if (ft == kQ3_K_M)
      t = s.i_attention_wv < 2 ? GgmlType::Q5_K : GgmlType::Q4_K;
    else if (ft == kQ3_K_L)
      t = GgmlType::Q5_K;
    else if ((ft == kQ4_K_M || ft == kQ5_K_M) && use_more_bits(s.i_attention_wv, s.n_attention_wv))
      t = GgmlType::Q6_K;
    else if (ft == kQ4_K_S && s.i_attention_wv < 4)
      t = GgmlType::Q5_K;
    if (s.m.is_70b && (t == GgmlType::Q3_K || t == GgmlType::Q4_K)) t = GgmlType::Q5_K;
    if (s.m.n_expert == 8) t = GgmlType::Q8_0;
    ++s.i_attention_wv;
  } else if (cat == Category::kAttnK) {
    if (s.m.n_expert == 8) t = GgmlType::Q8_0;
  } else if (cat == Category::kFfnDown) {
    const int il = ffn_layer(s, s.i_ffn_down, name);
    if (ft == kQ2_K) {
      t = GgmlType::Q3_K;
    } else if (ft == kQ3_K_M) {
      t = il < n_layer / 16                           ? GgmlType::Q5_K
          : !falcon || use_more_bits(il, n_layer) ? GgmlType::Q4_K
                                                  : GgmlType::Q3_K;
    } else if (ft == kQ3_K_L) {
      t = falcon ? GgmlType::Q4_K : GgmlType::Q5_K;
    } else if (ft == kQ4_K_M) {
      if (falcon)
        t = il < n_layer / 16 ? GgmlType::Q6_K : use_more_bits(il, n_layer) ? GgmlType::Q5_K : GgmlType::Q4_K;
      else if (use_more_bits(il, n_layer))
        t = GgmlType::Q6_K;
    } else if (ft == kQ5_K_M && use_more_bits(il, n_layer)) {
      t = GgmlType::Q6_K;
    } else if (ft == kQ4_K_S && !falcon && il < n_layer / 8) {
      t = GgmlType::Q5_K;
    }
    ++s.i_ffn_down;
  } else if (cat == Category::kAttnOutput) {
    if (!falcon) {
      if (s.m.n_expert == 8) {
        if (ft == kQ2_K || ft == kQ3_K_S || ft == kQ3_K_M || ft == kQ4_K_S || ft == kQ4_K_M) t = GgmlType::Q5_K;
      } else {
        if (ft == kQ2_K) t = GgmlType::Q3_K;
        else if (ft == kQ3_K_M) t = GgmlType::Q4_K;
        else if (ft == kQ3_K_L) t = GgmlType::Q5_K;
      }
    } else if (ft == kQ3_K_L) {
      t = GgmlType::Q4_K;
    }
  } else if (cat == Category::kFfnGate) {
    ffn_layer(s, s.i_ffn_gate, name);  // llama.cpp checks the layer here too
    ++s.i_ffn_gate;
  } else if (cat == Category::kFfnUp) {
    ffn_layer(s, s.i_ffn_up, name);
    ++s.i_ffn_up;
  }
  return t;
}

// llama.cpp's tensor_type_fallback: a type whose block does not divide the
// row width gives way to a 32-element type, and that to F16.
GgmlType fallback_type(GgmlType t, int64_t ne0, bool& fell_back) {
  const int64_t qk = type_traits(t).block_elems;
  fell_back = false;
  if (ne0 % qk == 0) return t;
  fell_back = true;
  GgmlType r = t;
  switch (t) {
    case GgmlType::Q2_K:
    case GgmlType::Q3_K: r = GgmlType::Q4_0; break;
    case GgmlType::Q4_K: r = GgmlType::Q5_0; break;
    case GgmlType::Q5_K: r = GgmlType::Q5_1; break;
    case GgmlType::Q6_K: r = GgmlType::Q8_0; break;
    default: break;  // a 32-element type: F16 below
  }
  if (ne0 % type_traits(r).block_elems != 0) r = GgmlType::F16;
  return r;
}

std::string shape_str(const std::vector<int64_t>& dims) {
  std::string s = fmt::format("{:6}", dims[0]);
  for (size_t i = 1; i < 4; ++i) s += fmt::format(", {:6}", i < dims.size() ? dims[i] : 1);
  return s;
}

double mib(uint64_t b) { return static_cast<double>(b) / 1024.0 / 1024.0; }

// ggml_validate_row_data for the types written here: no NaN or infinity in
// float data, finite f16 scales in quantized blocks. Returns false on a bad row.
bool row_is_valid(GgmlType t, const uint8_t* p, int64_t n) {
  auto h_ok = [](const uint8_t* q) { return (static_cast<uint16_t>(q[0] | (q[1] << 8)) & 0x7c00) != 0x7c00; };
  const TypeTraits& tt = type_traits(t);
  const int64_t nb = n / tt.block_elems;
  switch (t) {
    case GgmlType::F32:
      for (int64_t i = 0; i < n; ++i) {
        float f;
        std::memcpy(&f, p + 4 * i, 4);
        if (!std::isfinite(f)) return false;
      }
      return true;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i)
        if (!h_ok(p + 2 * i)) return false;
      return true;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i)
        if ((static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8)) & 0x7f80) == 0x7f80) return false;
      return true;
    default: break;
  }
  // Byte offsets of the f16 scales in each block (ggml-common.h).
  int off[2] = {-1, -1};
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: off[0] = 0; break;
    case GgmlType::Q4_1: case GgmlType::Q5_1: case GgmlType::Q4_K: case GgmlType::Q5_K: off[0] = 0, off[1] = 2; break;
    case GgmlType::Q2_K: off[0] = 80, off[1] = 82; break;
    case GgmlType::Q3_K: off[0] = 108; break;
    case GgmlType::Q6_K: off[0] = 208; break;
    case GgmlType::MXFP4:
      // An exponent byte of 0xFF (E8M0's NaN) is invalid.
      for (int64_t b = 0; b < nb; ++b)
        if (p[static_cast<size_t>(b) * tt.block_bytes] == 0xFF) return false;
      return true;
    default: return true;
  }
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = p + static_cast<size_t>(b) * tt.block_bytes;
    for (int o : off)
      if (o >= 0 && !h_ok(blk + o)) return false;
  }
  return true;
}

// The output file, written beside its final path and renamed into place.
class TempOutput {
 public:
  explicit TempOutput(const std::string& final_path) : final_(final_path) {
    std::random_device rd;
    for (int attempt = 0; attempt < 16 && fd_ < 0; ++attempt) {
      tmp_ = fmt::format("{}.tmp.{}.{:08x}", final_, ::getpid(), rd());
      fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd_ < 0 && errno != EEXIST) break;
    }
    if (fd_ < 0) fail(ErrorKind::kIo, "{}: cannot create the output: {}", final_, std::strerror(errno));
    buf_.reserve(kBuf);
  }
  ~TempOutput() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }
  TempOutput(const TempOutput&) = delete;
  TempOutput& operator=(const TempOutput&) = delete;

  void write(const uint8_t* p, size_t n) {
    if (buf_.size() + n > kBuf) flush();
    if (n >= kBuf) {
      write_all(p, n);
    } else {
      buf_.insert(buf_.end(), p, p + n);
    }
    written_ += n;
  }
  void zeros(size_t n) {
    static const uint8_t z[256] = {};
    while (n > 0) {
      const size_t k = std::min(n, sizeof z);
      write(z, k);
      n -= k;
    }
  }
  uint64_t written() const { return written_; }

  void commit() {
    flush();
    if (::fsync(fd_) != 0) fail(ErrorKind::kIo, "{}: write failed: {}", final_, std::strerror(errno));
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail(ErrorKind::kIo, "{}: write failed: {}", final_, std::strerror(errno));
    if (std::rename(tmp_.c_str(), final_.c_str()) != 0)
      fail(ErrorKind::kIo, "{}: cannot move the output into place: {}", final_, std::strerror(errno));
    committed_ = true;
  }

 private:
  static constexpr size_t kBuf = 4 << 20;
  void flush() {
    write_all(buf_.data(), buf_.size());
    buf_.clear();
  }
  void write_all(const uint8_t* p, size_t n) {
    while (n > 0) {
      const ssize_t k = ::write(fd_, p, n);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) fail(ErrorKind::kIo, "{}: write failed: {}", final_, std::strerror(k < 0 ? errno : ENOSPC));
      p += k;
      n -= static_cast<size_t>(k);
    }
  }
  std::string final_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
  uint64_t written_ = 0;
  std::vector<uint8_t> buf_;
};

void log_line(const QuantizeOptions& o, const std::string& s) {
  if (o.log) o.log(s);
}

}  // namespace

const std::vector<QuantizeType>& quantize_types() { return kTypes; }

std::optional<QuantizeType> find_quantize_type(const std::string& name) {
  const std::string l = lower(name);
  for (const auto& t : kTypes)
    if (lower(t.name) == l) return t;
  // A number: the llama_ftype (llama-quantize takes these too).
  if (!l.empty() && l.size() < 4 && std::all_of(l.begin(), l.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    const uint32_t n = static_cast<uint32_t>(std::stoul(l));
    for (const auto& t : kTypes)
      if (t.ftype == n && !std::string_view(t.desc).starts_with("alias")) return t;
  }
  return std::nullopt;
}

std::string quantize_type_list() {
  std::string s;
  for (const auto& t : kTypes) {
    if (!s.empty()) s += ", ";
    s += t.name;
  }
  return s;
}

std::vector<TensorPlanEntry> plan_quantization(const GgufFile& in, const QuantizeType& type,
                                               const QuantizeOptions& opts) {
  const ModelFacts facts = model_facts(in);
  std::vector<const GgufTensor*> order;
  for (const GgufTensor& t : in.tensors()) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(),
                   [](const GgufTensor* a, const GgufTensor* b) { return output_order(a->name, b->name); });

  MixState st{facts, type.ftype, true};
  for (const GgufTensor* t : order) {
    const Category c = category_of(t->name);
    if (is_attn_v_like(c)) ++st.n_attention_wv;
    if (c == Category::kOutput) st.tied = false;
  }

  const GgmlType def = type.default_type;
  std::vector<TensorPlanEntry> plan;
  plan.reserve(order.size());
  for (const GgufTensor* t : order) {
    TensorPlanEntry e;
    e.name = t->name;
    e.dims = t->dims;
    e.src_type = t->type;
    e.dst_type = t->type;
    e.fallback = false;
    if (allows_quantization(t->name, t->dims, opts)) {
      GgmlType nt = def;
      if (is_quantized(def)) {
        if (!opts.pure) nt = mix_type(st, nt, t->name, t->dims, category_of(t->name));
        bool fell = false;
        const GgmlType f = fallback_type(nt, t->dims[0], fell);
        if (fell) {
          e.fallback = true;
          log_line(opts, fmt::format("warning: {:<36} - ncols {:6} not divisible by {:3} (required for type {:>7}) "
                                     "{}-> falling back to {:>7}",
                                     t->name, t->dims[0], type_traits(nt).block_elems, type_traits(nt).name,
                                     f == GgmlType::F16 ? "(WARNING: must use F16 due to unusual shape) " : "",
                                     type_traits(f).name));
        }
        nt = f;
      }
      e.dst_type = nt;
    }
    e.converted = e.dst_type != e.src_type;
    e.src_bytes = t->n_bytes;
    e.dst_bytes = e.converted ? row_bytes(e.dst_type, t->dims[0]) * static_cast<uint64_t>(t->rows()) : t->n_bytes;
    if (e.converted) {
      const TypeTraits& src = type_traits(e.src_type);
      if (!src.can_dequantize)
        fail(ErrorKind::kUnsupported, "quantize: tensor '{}' is {}, which Tandem cannot convert (no dequantizer)",
             e.name, src.name);
      if (is_quantized(e.src_type) && is_quantized(e.dst_type) && !opts.allow_requantize)
        fail(ErrorKind::kInvalidArgument,
             "quantize: tensor '{}' is already quantized ({}); requantizing it to {} adds the error of both "
             "quantizations. Quantize from an F32/F16/BF16 file, or pass --allow-requantize",
             e.name, src.name, type_traits(e.dst_type).name);
    }
    plan.push_back(std::move(e));
  }
  return plan;
}

QuantizeReport quantize_model(const std::string& in_path, const std::string& out_path, const QuantizeType& type,
                              const QuantizeOptions& opts) {
  namespace fs = std::filesystem;
  const auto t0 = std::chrono::steady_clock::now();
  if (!opts.dry_run) {
    if (out_path.empty()) fail(ErrorKind::kInvalidArgument, "quantize: no output path");
    std::error_code ec;
    if (fs::exists(out_path, ec) && fs::equivalent(in_path, out_path, ec))
      fail(ErrorKind::kInvalidArgument, "quantize: the output '{}' is the input file; give another path", out_path);
    if (fs::is_directory(out_path, ec))
      fail(ErrorKind::kInvalidArgument, "quantize: the output '{}' is a directory", out_path);
  }
  std::unique_ptr<GgufFile> in = GgufFile::open(in_path);
  const std::vector<TensorPlanEntry> plan = plan_quantization(*in, type, opts);

  // Metadata: the input's keys in order, less the split keys and the two
  // llama.cpp sets, which come last (gguf_set_val removes and appends).
  GgufWriter w(in->alignment());
  for (const GgufKV& kv : in->metadata()) {
    if (kv.key == "general.quantization_version" || kv.key == "general.file_type" || kv.key == "split.no" ||
        kv.key == "split.count" || kv.key == "split.tensors.count")
      continue;
    w.add(kv.key, kv.value);
  }
  w.add_u32("general.quantization_version", 2);
  w.add_u32("general.file_type", type.ftype);
  for (const auto& e : plan) w.add_tensor_info(e.name, e.dst_type, e.dims);

  QuantizeReport rep;
  for (const auto& e : plan) {
    ++rep.n_tensors;
    rep.n_converted += e.converted;
    rep.n_fallback += e.fallback;
    int64_t n = 1;
    for (int64_t d : e.dims) n *= d;
    rep.n_elements += n;
    rep.bytes_in += e.src_bytes;
    rep.bytes_out += e.dst_bytes;
    ++rep.tensors_per_type[std::string(type_traits(e.dst_type).name)];
  }

  auto summary = [&] {
    log_line(opts, fmt::format("quantize: model size  = {:8.2f} MiB ({:.2f} BPW)", mib(rep.bytes_in), rep.bpw_in()));
    log_line(opts, fmt::format("quantize: quant size  = {:8.2f} MiB ({:.2f} BPW)", mib(rep.bytes_out), rep.bpw_out()));
    if (rep.n_fallback > 0)
      log_line(opts, fmt::format("quantize: WARNING: {} of {} tensor(s) required fallback quantization", rep.n_fallback,
                                 rep.n_tensors));
  };

  if (opts.dry_run) {
    int idx = 0;
    for (const auto& e : plan) {
      const std::string head = fmt::format("[{:4}/{:4}] {:<36} - [{}], type = {:>6}, ", ++idx, plan.size(), e.name,
                                           shape_str(e.dims), type_traits(e.src_type).name);
      log_line(opts, e.converted ? head + fmt::format("size = {:8.2f} MiB -> {:8.2f} MiB ({})", mib(e.src_bytes),
                                                       mib(e.dst_bytes), type_traits(e.dst_type).name)
                                 : head + fmt::format("size = {:8.3f} MiB", mib(e.src_bytes)));
    }
    summary();
    rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return rep;
  }

  TempOutput out(out_path);
  const std::vector<uint8_t> head = w.header();
  out.write(head.data(), head.size());
  const uint64_t align = w.alignment();

  ThreadPool pool(opts.n_threads);
  std::vector<std::vector<float>> scratch(static_cast<size_t>(pool.size()));
  std::vector<uint8_t> slab;
  int idx = 0;
  for (const auto& e : plan) {
    if (opts.cancel && opts.cancel->load()) fail(ErrorKind::kIo, "quantize: interrupted");
    const GgufTensor* t = in->find_tensor(e.name);
    std::string line = fmt::format("[{:4}/{:4}] {:<36} - [{}], type = {:>6}, ", ++idx, plan.size(), e.name,
                                   shape_str(e.dims), type_traits(e.src_type).name);
    if (!e.converted) {
      out.write(t->data, t->n_bytes);
      line += fmt::format("size = {:8.3f} MiB", mib(e.src_bytes));
    } else {
      const int64_t ne0 = e.dims[0], rows = t->rows();
      const size_t src_rb = row_bytes(e.src_type, ne0), dst_rb = row_bytes(e.dst_type, ne0);
      // Rows in slabs of about 32 MiB of output and f32 values together.
      const int64_t slab_rows =
          std::max<int64_t>(1, static_cast<int64_t>((32u << 20) / (dst_rb + static_cast<size_t>(ne0) * 4)));
      slab.resize(static_cast<size_t>(std::min(rows, slab_rows)) * dst_rb);
      for (auto& s : scratch) s.resize(static_cast<size_t>(ne0));
      const int64_t grain = std::max<int64_t>(1, 16384 / ne0);
      for (int64_t r0 = 0; r0 < rows; r0 += slab_rows) {
        if (opts.cancel && opts.cancel->load()) fail(ErrorKind::kIo, "quantize: interrupted");
        const int64_t n = std::min(slab_rows, rows - r0);
        std::atomic<int64_t> bad_row{-1};
        pool.parallel_chunks(n, grain, [&](int th, int64_t b, int64_t end) {
          float* f = scratch[static_cast<size_t>(th)].data();
          for (int64_t r = b; r < end; ++r) {
            dequantize_row(e.src_type, t->data + static_cast<size_t>(r0 + r) * src_rb, f, ne0);
            uint8_t* dst = slab.data() + static_cast<size_t>(r) * dst_rb;
            quantize_row(e.dst_type, f, dst, ne0);
            if (!row_is_valid(e.dst_type, dst, ne0)) {
              int64_t expected = -1;
              bad_row.compare_exchange_strong(expected, r0 + r);
            }
          }
        });
        if (bad_row.load() >= 0)
          fail(ErrorKind::kInvalidFile,
               "quantize: tensor '{}' row {}: the {} data is not finite (NaN or infinity in the input, or values "
               "beyond the type's range)",
               e.name, bad_row.load(), type_traits(e.dst_type).name);
        out.write(slab.data(), static_cast<size_t>(n) * dst_rb);
      }
      line += fmt::format("converting to {} .. size = {:8.2f} MiB -> {:8.2f} MiB", type_traits(e.dst_type).name,
                          mib(e.src_bytes), mib(e.dst_bytes));
    }
    const uint64_t pad = (e.dst_bytes + align - 1) / align * align - e.dst_bytes;
    out.zeros(static_cast<size_t>(pad));
    in->release_pages(t->data, static_cast<size_t>(t->n_bytes));
    log_line(opts, line);
  }
  rep.file_bytes = out.written();
  out.commit();
  summary();
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace tandem
