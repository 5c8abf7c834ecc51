// The KV cache: keys and values of every layer, kept in fixed-size blocks of
// `block_size` token slots drawn from one pool. A sequence owns a block table
// (its blocks in position order), so attention always reads K/V through the
// table; how blocks are handed out (contiguously now, shared and paged by the
// serving engine) does not change the kernels.
//
// K and V each have an element type (kernels/attention_kv.h): f16 (the
// default, as in llama.cpp), f32, or the 32-element block formats q8_0 and
// q4_0. Rows are written from f32 (round-to-nearest-even, llama.cpp's
// reference quantizers); attention converts back to f32 as it reads, so
// queries and all accumulation stay f32.
//
// A head stored as q4_0 is first rotated by a fixed orthogonal transform (a
// normalized Walsh-Hadamard matrix H, its own inverse): q.k = Hq.Hk, and an
// outlier dimension is spread over the whole head instead of setting the
// scale of its group of 32 (QuaRot). The model brings queries into the keys'
// space and attention outputs back out of the values' (rotate_queries,
// unrotate_outputs); attention itself reads the cache as stored.
//
// Quantized keys are also smoothed (set_key_smoothing;
// model/key_smoothing.h): element i of a layer's key is stored as
// (k_i - mu_i) * s_i, and queries are divided by s. Every score of a query
// row moves by the same q.mu, which the softmax cancels, while the quantizer
// spends its 4 bits on what differs between keys instead of on the part they
// share, and on the elements the queries weigh most (SmoothAttention).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/attention_kv.h"
#include "kv/key_bounds.h"

namespace tandem {

const char* kv_type_name(KvType t);  // "f16", "f32", "q8_0", "q4_0"
// Throws kInvalidArgument naming the value when it is none of those.
KvType parse_kv_type(std::string_view name);

// Which quantized parts are Hadamard-rotated: the 4-bit ones (kAuto, the
// default), none, or every quantized one.
enum class KvRotation : uint8_t { kAuto, kOff, kAll };
const char* kv_rotation_name(KvRotation r);  // "auto", "off", "all"
KvRotation parse_kv_rotation(std::string_view name);

// What the command line asks for.
struct KvCacheTypes {
  KvType k = KvType::kF16, v = KvType::kF16;
  KvRotation rotation = KvRotation::kAuto;
  bool smooth_keys = true;  // quantized keys stored through a KeySmoothing
  // Sliding-window layers keep every block, as full-attention layers do
  // (llama.cpp's --swa-full). Off: they give back the blocks their window
  // has passed (KvPaging); the CUDA backend always keeps them.
  bool swa_full = false;
  // A streaming window (StreamingLLM): > 0 keeps the first `sinks` positions
  // and the last `window` of a sequence and evicts the ones between, so it
  // runs past the context at constant memory (engine/llm_engine.cpp, stream).
  int32_t window = 0, sinks = 4;
  // Heavy hitters (H2O): with a window, also keep the `heavy` older
  // positions (whole blocks) with the most attention summed so far.
  int32_t heavy = 0;
};

// The most positions a streaming sequence holds: its sinks, heavy hitters
// and window, and the block that fills before an eviction (0 without a
// window). A prompt chunk ends there.
inline int64_t stream_positions(const KvCacheTypes& t, int32_t block_size) {
  return t.window > 0 ? int64_t{t.window} + t.sinks + t.heavy + block_size : 0;
}

// How a cache stores K and V. kv_format() is where the rotation and the
// smoothing are decided.
struct KvFormat {
  KvType k = KvType::kF16, v = KvType::kF16;
  bool rotate_k = false, rotate_v = false;  // Hadamard-rotate each head before storing it
  bool smooth_k = false;                    // store keys through the cache's KeySmoothing
};

// A layer's keys are stored as (k - offset) * scale, element by element, and
// its queries divided by the scale: n_layer x k_width floats each.
struct KeySmoothing {
  std::vector<float> offset, scale;
};
KvFormat kv_format(const KvCacheTypes& t);
inline KvFormat kv_format(KvType k, KvType v) { return kv_format(KvCacheTypes{k, v}); }
std::string kv_format_name(const KvFormat& f);  // "f16", "k q8_0 / v f16", ...

// x (n elements, n a multiple of 32) times H in place: blocks of the largest
// power of two dividing n, each a normalized Walsh-Hadamard transform.
void hadamard_rotate(float* x, int32_t n);

struct KvShape {
  int32_t n_layer = 0;
  int32_t k_width = 0;  // n_head_kv * head_dim
  int32_t v_width = 0;  // n_head_kv * head_dim_v
  int32_t n_head_kv = 0;
};

// Which layers share a block. A block id names one page of the pool: the K/V
// of `layers_per_page` layers for block_size positions. The layers of one
// group read one block table. Group 0 holds the layers that attend to the
// whole context; groups 1.. hold sliding-window layers, which only ever read
// the last `window` positions: their old pages can be given back while the
// sequence runs on (vLLM's hybrid allocator does the same), so a long
// context costs about its full-attention layers' memory.
struct KvPaging {
  int32_t layers_per_page = 0;  // 0: every layer on one page, one group
  int32_t n_groups = 1;
  int32_t window = 0;               // positions the windowed groups' layers see
  std::vector<int32_t> group, slot;  // per layer: its group and its place on the page
  int32_t n_windowed() const { return n_groups - 1; }
};
// One group of every layer: today's layout, and the layout with
// --swa-full. Otherwise the windowed layers (layer_windowed[l]) get groups of
// as many layers as there are full-attention ones (the last one padded).
KvPaging kv_paging(int32_t n_layer);
KvPaging kv_paging(const std::vector<bool>& layer_windowed, int32_t window);

class KvCache {
 public:
  // Throws kInvalidArgument for an empty pool or shape, or a quantized type
  // whose groups do not fit the heads (a head size not a multiple of 32) or
  // the kernels (a block size not a multiple of 16); kResource when the pool
  // cannot be allocated.
  // Throws kInvalidArgument too for a paging that does not cover the layers.
  KvCache(const KvShape& shape, int32_t n_blocks, int32_t block_size, const KvFormat& format,
          KvPaging paging = {});
  KvCache(const KvShape& shape, int32_t n_blocks, int32_t block_size = 16, KvType type = KvType::kF16)
      : KvCache(shape, n_blocks, block_size, kv_format(type, type)) {}

  const KvShape& shape() const { return shape_; }
  const KvFormat& format() const { return format_; }
  const KvPaging& paging() const { return paging_; }
  int32_t group(int32_t layer) const { return paging_.group[layer]; }
  int32_t block_size() const { return block_size_; }
  int32_t n_blocks() const { return n_blocks_; }
  int32_t n_free() const { return static_cast<int32_t>(free_.size()); }
  size_t bytes() const { return block_bytes() * size_t(n_blocks_); }
  // K/V bytes of one position over every layer: what a token costs when all
  // its pages are held.
  static size_t bytes_per_token(const KvShape& s, const KvFormat& f) {
    return size_t(s.n_layer) * layer_bytes_per_token(s, f);
  }
  static size_t layer_bytes_per_token(const KvShape& s, const KvFormat& f) {
    return kv_bytes(f.k, s.k_width) + kv_bytes(f.v, s.v_width);
  }

  int32_t allocate();  // -1 when the pool is empty
  void release(int32_t block);

  // Stores one token's k (k_width floats) and v (v_width floats) in a slot,
  // rotated and converted as the format says.
  void write(int32_t layer, int32_t block, int32_t slot, const float* k, const float* v);
  // Reads a slot back as f32 as stored (rotated where the format rotates,
  // keys smoothed): what attention reads, for tests and tools.
  void read(int32_t layer, int32_t block, int32_t slot, float* k, float* v) const;

  // One token's keys alone (k_width floats), in the model's space: read
  // unrotated and unsmoothed, written smoothed, rotated and converted.
  // Re-positioning kept keys (a streaming window's sinks) goes through them.
  void read_key(int32_t layer, int32_t block, int32_t slot, float* k) const;
  void write_key(int32_t layer, int32_t block, int32_t slot, const float* k);

  // How keys are stored from now on (empty vectors: as they are). Attention
  // is unchanged in exact arithmetic: q / s . (k - mu) * s = q.k - q.mu for
  // every key of a row. Set before the first write; kInvalidArgument for
  // sizes other than n_layer x k_width or a scale that is not finite and > 0.
  void set_key_smoothing(KeySmoothing smoothing);

  // Layer `layer`'s queries (n_head heads of head_dim, grouped over the
  // cache's KV heads) into the space its keys are stored in, and attention
  // outputs (n_head heads of head_dim_v) back from the values' space:
  // no-ops unless the format rotates or smooths.
  void rotate_queries(int32_t layer, float* q, int32_t n_head, int32_t head_dim) const;
  void unrotate_outputs(float* out, int32_t n_head, int32_t head_dim_v) const;

  // K/V bytes of one block (page): its layers, every head.
  size_t block_bytes() const {
    return layer_bytes_per_token(shape_, format_) * size_t(paging_.layers_per_page) * size_t(block_size_);
  }
  // Block `dst` gets block `src`'s K/V, bit for bit (copy-on-write).
  void copy_block(int32_t src, int32_t dst);
  // Slots [from, to) of block `dst` get those of block `src`, bit for bit,
  // every layer of the page and head (a streaming window closing a gap).
  void copy_slots(int32_t src, int32_t dst, int32_t from, int32_t to);
  // A block's K/V as block_bytes() bytes, and back (swapping a preempted
  // sequence out of the pool and in again). kInvalidArgument for a block
  // outside the pool.
  void save_block(int32_t block, std::byte* out) const;
  void load_block(int32_t block, const std::byte* in);

  KvLayerView layer_view(int32_t layer, const int32_t* blocks) const;

  // Per-block key bounds for sparse attention (kv/key_bounds.h), kept from
  // now on for the flagged layers; null until asked for. copy_block copies
  // them and load_block recomputes them; the writer of a block's last slot
  // updates them (Model::forward).
  void keep_key_bounds(const std::vector<bool>& layers);
  const KeyBounds* key_bounds() const { return bounds_.get(); }
  KeyBounds* key_bounds() { return bounds_.get(); }

 private:
  void check_block(int32_t block) const;
  // Calls f(run, bytes) for each (layer, head) run of K and of V that
  // `block` holds, in one fixed order.
  template <typename F>
  void for_each_run(int32_t block, F&& f) const;
  // Elements of one head's K or V row.
  int32_t k_head() const { return shape_.k_width / shape_.n_head_kv; }
  int32_t v_head() const { return shape_.v_width / shape_.n_head_kv; }
  // Bytes of one head's block of K / V.
  size_t k_region() const { return kv_bytes(format_.k, size_t(block_size_) * k_head()); }
  size_t v_region() const { return kv_bytes(format_.v, size_t(block_size_) * v_head()); }
  // Byte offsets of head h's block of K / V for the layer at `slot` of the
  // page: [slot][head][block].
  size_t k_offset(int32_t slot, int32_t block, int32_t h) const {
    return ((size_t(slot) * shape_.n_head_kv + h) * n_blocks_ + block) * k_region();
  }
  size_t v_offset(int32_t slot, int32_t block, int32_t h) const {
    return ((size_t(slot) * shape_.n_head_kv + h) * n_blocks_ + block) * v_region();
  }
  KvShape shape_;
  int32_t n_blocks_;
  int32_t block_size_;
  KvFormat format_;
  KvPaging paging_;
  KeySmoothing smoothing_;
  std::vector<float> inv_scale_;  // 1 / smoothing_.scale
  struct Free {
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte[], Free> k_, v_;
  std::vector<int32_t> free_;
  std::unique_ptr<KeyBounds> bounds_;
};

// One sequence's share of the cache.
struct SeqKv {
  std::vector<int32_t> blocks;                  // group 0's table
  std::vector<std::vector<int32_t>> windowed;  // groups 1..'s tables; -1: a page given back
  int32_t n_tokens = 0;  // positions [0, n_tokens) hold valid K/V
  // Positions a streaming window removed after its sinks: a row at cache
  // position p is rotated as position p + rope_shift (kept keys keep their
  // rotation; the sinks are rotated on by as much, so every distance is the
  // one in the cache, as StreamingLLM has it).
  int32_t rope_shift = 0;
  // Heavy-hitter eviction: if set, every layer's attention weight on each
  // cache position (summed over heads and query rows) is added here.
  float* attn_mass = nullptr;
  // Sparse attention (kernels/sparse_select.h): > 0, the budget in positions
  // of this sequence's rows at cache positions >= sparse_from in the layers
  // the cache keeps key bounds for; 0: dense.
  int32_t sparse_budget = 0;
  int32_t sparse_from = 0;

  const int32_t* table(int32_t group) const { return group == 0 ? blocks.data() : windowed[group - 1].data(); }

  // Makes room for positions up to `n` (exclusive) in every group. False
  // when the pool ran out (nothing is allocated then).
  bool reserve(KvCache& cache, int32_t n);
  void release(KvCache& cache);
};

}  // namespace tandem
