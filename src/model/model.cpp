#include "model/model.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"
#include "runtime/memory_info.h"
#include "quant/quant.h"
#include "runtime/thread_pool.h"
#include "gguf/gguf.h"
#include "kernels/attention.h"
#include "kernels/product_kernels.h"
#include "kernels/products.h"
#include "kernels/ops.h"
#include "kernels/layouts.h"
#include "kernels/sparse_select.h"
#include "kv/kv_cache.h"
#include "model/latent_attention.h"
#include "model/layer_recipe.h"
#include "model/moe_ffn.h"
#include "model/repack_cache.h"
#include "tokenizer/tokenizer.h"

namespace tandem {


// Activations of the rows in flight, one row per batch row (q, k, v, rope
// angles, attention output, feed-forward gate and up: one chunk's rows).
struct Model::Scratch {
  std::vector<float> x, xn, q, k, v, attn, o, gate, up;
  std::vector<float> rope_cos, rope_sin;  // [row][rope_dims/2]
  std::vector<KvLayerView> views;
  std::vector<int32_t> positions;
  std::vector<int64_t> decode_rows;
  std::vector<float*> decode_mass;  // each decode row's SeqKv::attn_mass
  std::vector<float> q_decode, out_decode;
  // Sparse attention: the decode rows it selects blocks for, and their
  // per-head tables.
  struct SparseRow {
    int64_t b;  // index among the decode rows
    const SeqKv* sk;
    int32_t n_table;
    size_t at;  // the row's tables in sparse_tables
  };
  std::vector<SparseRow> sparse_rows;
  std::vector<int32_t> sparse_tables;
  std::vector<float> attn_kept;  // the last layer's attention rows that go on
  std::vector<int64_t> want;     // rows that asked for logits
  std::vector<uint8_t> embd_row;  // an embedding row's bytes, read from the file
  Matmul mm;
  MoeFfn moe;
  Scratch(KernelLevel level, const StreamTuning& tuning) : mm(level, tuning), moe(level) {}
};

Model::~Model() = default;

std::unique_ptr<Model> Model::load(const std::string& path, const RuntimeOptions& opts) {
  std::unique_ptr<Model> m(new Model());
  m->opts_ = opts;
  m->level_ = opts.kernels.value_or(active_kernel_level());
  if (!cpu_supports_level(m->level_))
    fail(ErrorKind::kInvalidArgument, "kernel level {} is not supported by this CPU", kernel_level_name(m->level_));
  m->file_ = GgufFile::open(path);
  m->cfg_ = ModelConfig::from_gguf(*m->file_);
  m->w_ = ModelWeights::bind(*m->file_, m->cfg_);
  m->tok_ = Tokenizer::from_gguf(*m->file_);
  m->file_->release_metadata_pages();  // the vocabulary's arrays were read from the mapping
  if (m->tok_->n_vocab() != m->cfg_.n_vocab)
    fail(ErrorKind::kInvalidFile, "{}: the vocabulary has {} tokens but token_embd.weight has {} rows", path,
         m->tok_->n_vocab(), m->cfg_.n_vocab);
  m->s_ = std::make_unique<Scratch>(m->level_, stream_tuning(opts));
  if (m->cfg_.latent_attention()) m->latent_ = std::make_unique<LatentScratch>(m->level_, stream_tuning(opts));
  m->prepack_weights(opts);
  // Reading the norm vectors at bind, and the repacking, mapped pages of the
  // file around what they read (fault-around maps up to 64 KiB, a large
  // folio all of it) that the model may never read again. What is read from
  // the file from here on faults back in.
  m->file_->release_all_pages();
  return m;
}

void Model::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }

KvShape kv_shape_of(const ModelConfig& c) {
  if (c.latent_attention()) return {c.n_layer, c.rope_dims, c.kv_lora_rank, 1};
  return {c.n_layer, c.n_head_kv * c.head_dim, c.n_head_kv * c.head_dim_v, c.n_head_kv};
}

KvShape Model::kv_shape() const { return kv_shape_of(cfg_); }

std::string describe_kv_cache(const ModelConfig& c) {
  const KvShape shape = kv_shape_of(c);
  auto bytes = [&](KvType t) { return KvCache::bytes_per_token(shape, kv_format(t, t)); };
  const std::string layout =
      c.latent_attention()
          ? fmt::format("latent, {} + {} rope values a layer for all {} heads (per head it would be {} x {})",
                        c.kv_lora_rank, c.rope_dims, c.n_head, c.n_head, c.head_dim + c.head_dim_v)
          : fmt::format("per head, {} KV heads of {} + {} values a layer", c.n_head_kv, c.head_dim, c.head_dim_v);
  return fmt::format("kv cache: {}, {} layers: {} bytes per token in f16 ({} in f32, {} in q8_0)\n", layout,
                     c.n_layer, bytes(KvType::kF16), bytes(KvType::kF32), bytes(KvType::kQ8_0));
}

namespace {

// Memory for repacked weights. With huge_pages, buffers of 2 MiB or more are
// 2 MiB aligned and asked for transparent huge pages: decode streams them once
// per token, and in a VM every 4 KiB page's TLB miss is a two-level walk. Not
// the default: fresh huge pages can make a load several times slower (the
// kernel zeroing them). docs/performance.md has the numbers.
uint8_t* alloc_weights(size_t bytes, bool huge_pages) {
  constexpr size_t kHuge = size_t{2} << 20;
  const bool huge = bytes >= kHuge && huge_pages;
  const size_t align = huge ? kHuge : 64;
  const size_t size = (bytes + align - 1) / align * align;
  auto* buf = static_cast<uint8_t*>(std::aligned_alloc(align, size));
  if (!buf) fail(ErrorKind::kResource, "out of memory repacking {} bytes of weights", bytes);
  if (huge) ::madvise(buf, size, MADV_HUGEPAGE);  // advice only: failure leaves 4 KiB pages
  return buf;
}

// Faults in [p, p + n) on the pool's threads before the repacking writes it
// (MADV_POPULATE_WRITE, Linux 5.14+; elsewhere the writes fault as before):
// faulting fresh memory is much of a load, and populating is the cheaper way.
void populate(uint8_t* p, size_t n, ThreadPool& pool) {
#ifdef MADV_POPULATE_WRITE
  constexpr uintptr_t kPage = 4096, kPiece = uintptr_t{2} << 20;
  const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + kPage - 1) / kPage * kPage;
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + n) / kPage * kPage;
  if (b <= a) return;
  const auto pieces = static_cast<int64_t>((b - a + kPiece - 1) / kPiece);
  pool.parallel_for(pieces, 1, [&](int64_t i0, int64_t i1) {
    const uintptr_t s = a + static_cast<uintptr_t>(i0) * kPiece;
    const uintptr_t e = std::min(b, a + static_cast<uintptr_t>(i1) * kPiece);
    // Advice only: on failure (an old kernel) the writes fault the pages in.
    ::madvise(reinterpret_cast<void*>(s), e - s, MADV_POPULATE_WRITE);
  });
#else
  (void)p, (void)n, (void)pool;
#endif
}

}  // namespace

// Gives every linear layer the layout choose_layout picks for opts.prepack
// (kernels/products.h): panels or tiles, copied from the file's rows (or
// mapped from the repack cache), and drops the file's pages of what was copied.
void Model::prepack_weights(const RuntimeOptions& opts) {
  const PrepackMode mode = opts.prepack;
  const std::string& cache_dir = opts.repack_cache;
  if (mode == PrepackMode::kOff) return;
  const KernelLevel level = level_;
  std::vector<WeightMatrix*> all;
  std::vector<LayoutChoice> layouts;  // of each matrix in `all`
  std::vector<size_t> sizes;
  {
    std::vector<WeightMatrix*> every = {&w_.output};
    for (LayerWeights& L : w_.layers) {
      for (WeightMatrix* W : L.matrices())
        if (*W) every.push_back(W);
      if (L.moe) {
        every.push_back(&L.moe.router);
        for (WeightMatrix* W : L.moe.matrices()) every.push_back(W);
      }
    }
    for (WeightMatrix* W : every)
      if (const LayoutChoice c = choose_layout(*W, level, mode); c.layout != WeightLayout::kFileRows)
        all.push_back(W), layouts.push_back(c), sizes.push_back(c.bytes);
  }
  if (all.empty()) return;
  // Embedding lookups read q32 panels and tiles (dequantize_weight_row); a
  // tied embedding in K-quant panels keeps its file rows for them.
  const auto lookups_in_new_layout = [&](const WeightMatrix& W, WeightLayout layout) {
    return layout != WeightLayout::kPanels || gemm_class(W.type) == GemmClass::kQ32;
  };
  const auto bind = [&](WeightMatrix* W, WeightLayout layout, const uint8_t* buf) {
    W->set_layout(layout, buf);
    if (w_.tok_embd.data == W->data && lookups_in_new_layout(*W, layout)) w_.tok_embd.set_layout(layout, buf);
  };

  if (!cache_dir.empty()) {
    repack_cache_ = std::make_unique<RepackCache>(
        cache_dir, file_->path(), fmt::format("{} {}", kernel_level_name(level), static_cast<int>(mode)));
    if (const std::vector<const uint8_t*> bufs = repack_cache_->open(sizes); !bufs.empty()) {
      for (size_t i = 0; i < all.size(); ++i) {
        packed_.push_back({nullptr, bufs[i], sizes[i]});
        bind(all[i], layouts[i].layout, bufs[i]);  // the file's rows were never touched: nothing to release
      }
      repack_cache_hit_ = true;
      return;
    }
  }

  // The copies are new memory (the file's pages are page cache, given back as
  // the copying goes): when they would not fit, the weights stay where they
  // are, slower to decode but loaded, where the OOM killer would end the load.
  size_t total = 0;
  for (size_t b : sizes) total += b;
  if (const auto avail = available_memory_bytes(opts.memory_available); avail && total > *avail) {
    load_warning_ = fmt::format(
        "repacking the weights takes {} MiB and {} MiB of memory are available: they stay in the file's layout "
        "(decode is slower; --prepack off chooses that without this warning)",
        total >> 20, *avail >> 20);
    return;
  }
  ThreadPool pool(0);
  for (size_t i = 0; i < all.size(); ++i) {
    WeightMatrix* W = all[i];
    const size_t bytes = sizes[i];
    const WeightLayout layout = layouts[i].layout;
    const bool keep_file_rows = w_.tok_embd.data == W->data && !lookups_in_new_layout(*W, layout);
    uint8_t* buf = alloc_weights(bytes, opts.huge_pages);
    packed_.push_back({std::unique_ptr<uint8_t, FreeDeleter>(buf), buf, bytes});
    // In slices, releasing each slice's file pages once written, so that a
    // large matrix (Gemma's 178 MB embedding) is not held twice at the peak.
    const int64_t tiles = layout_tile_count(*W, layout);
    constexpr int64_t kSliceTiles = 256;
    for (int64_t t0 = 0; t0 < tiles; t0 += kSliceTiles) {
      const int64_t t1 = std::min(tiles, t0 + kSliceTiles);
      // Tiles take equal bytes; the slice's only, so the peak stays one slice.
      const size_t b0 = bytes * static_cast<size_t>(t0) / static_cast<size_t>(tiles);
      populate(buf + b0, bytes * static_cast<size_t>(t1) / static_cast<size_t>(tiles) - b0, pool);
      write_layout(*W, layout, level, buf, t0, t1, pool);
      const int64_t r0 = t0 * kGemmTile, r1 = std::min(W->rows, t1 * kGemmTile);
      if (!keep_file_rows)
        file_->release_pages(W->row(r0), static_cast<size_t>(r1 - r0) * W->row_stride);
    }
    bind(W, layout, buf);
  }
  if (repack_cache_) {
    std::vector<std::span<const uint8_t>> bufs;
    for (const Repacked& p : packed_) bufs.emplace_back(p.buf, p.bytes);
    if (std::string why = repack_cache_->write(bufs); !why.empty())
      load_warning_ = fmt::format("the repacked weights were not cached: {}", why);
  }
}

size_t Model::packed_bytes() const {
  size_t n = 0;
  for (const Repacked& p : packed_) n += p.bytes;
  return n;
}

std::vector<std::span<const uint8_t>> Model::decode_weight_regions() const {
  auto size_of = [&](const uint8_t* buf) {
    for (const Repacked& p : packed_)
      if (p.buf == buf) return p.bytes;
    return size_t{0};
  };
  std::vector<std::span<const uint8_t>> out;
  auto add = [&](const WeightMatrix& W) {
    if (W.panels()) return out.emplace_back(W.panels(), size_of(W.panels())), void();
    if (!W) return;
    int64_t r0 = 0;
    if (W.tiles()) {
      out.emplace_back(W.tiles(), size_of(W.tiles()));
      r0 = W.rows / kGemmTile * kGemmTile;
    }
    if (r0 < W.rows) out.emplace_back(W.row(r0), static_cast<size_t>(W.rows - r0) * W.row_stride);
  };
  // Of a MoE layer, k experts: a decode row reads the k its router picks,
  // all of one shape and layout, so the first k stand for them.
  add(w_.output);
  for (const LayerWeights& L : w_.layers) {
    for (const WeightMatrix* W : L.matrices()) add(*W);
    add(L.k_b);  // latent attention's up-projections, read in the file's rows
    add(L.v_b);
    if (!L.moe) continue;
    add(L.moe.router);
    for (const WeightMatrix* W : {&L.moe.sh_gate, &L.moe.sh_up, &L.moe.sh_down}) add(*W);
    for (int32_t e = 0; e < cfg_.n_expert_used; ++e)
      for (const auto* kind : {&L.moe.gate, &L.moe.up, &L.moe.down}) add((*kind)[e]);
  }
  return out;
}

// One pass's layer steps on the CPU (decoder_layer's Steps): every row of
// the batch, until the last layer's attention keeps only the rows in `keep`.
struct Model::LayerSteps {
  Model& m;
  const Batch& batch;
  std::span<SeqKv* const> seqs;
  KvCache& kv;
  ThreadPool& pool;
  const std::vector<int64_t>* keep;  // set for the last layer when rows skip its end
  int64_t R;                         // rows going on

  void attention_norm(int32_t il) {
    const ModelConfig& c = m.cfg_;
    const LayerWeights& L = m.w_.layers[il];
    Scratch& s = *m.s_;
    const int64_t E = c.n_embd;
    pool.parallel_for(R, 8, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        rms_norm_at(m.level_, s.x.data() + r * E, L.attn_norm.data(), E, c.rms_eps, s.xn.data() + r * E);
    });
  }

  void attention(int32_t il) {
    const ModelConfig& c = m.cfg_;
    const LayerWeights& L = m.w_.layers[il];
    Scratch& s = *m.s_;
    const int64_t E = c.n_embd;
    const int64_t OW = int64_t{c.n_head} * c.head_dim_v;
    s.o.resize(R * E);
    // In chunks of rows, like the feed-forward block: q and the attention
    // output are a long prompt's next widest activations. A chunk's rows see
    // the KV of every earlier row, written by earlier chunks, so a row's
    // result does not depend on the chunking.
    const int64_t CA = std::min(R, kAttnChunkRows);
    size_t k = 0;  // next kept row
    if (keep) s.attn_kept.resize(keep->size() * OW);
    for (int64_t c0 = 0; c0 < R; c0 += CA) {
      const int64_t n = std::min(CA, R - c0);
      m.attention_rows(il, batch, c0, n, seqs, kv, pool);
      if (!keep) {
        s.mm.run(L.wo, s.attn.data(), OW, n, s.o.data() + c0 * E, E, pool);
        add_out_bias(L, s.o.data() + c0 * E, n);
        continue;
      }
      for (; k < keep->size() && (*keep)[k] < c0 + n; ++k)
        std::copy_n(s.attn.data() + ((*keep)[k] - c0) * OW, OW, s.attn_kept.data() + k * OW);
    }
    if (keep) {
      // From here on the kept rows only, moved to the front: keep[i] >= i, so
      // copying in increasing order never overwrites a row still to move.
      R = static_cast<int64_t>(keep->size());
      s.mm.run(L.wo, s.attn_kept.data(), OW, R, s.o.data(), E, pool);
      add_out_bias(L, s.o.data(), R);
      for (int64_t i = 0; i < R; ++i)
        if ((*keep)[i] != i) std::copy_n(s.x.data() + (*keep)[i] * E, E, s.x.data() + i * E);
    }
  }

  // o += the output projection's bias (gpt-oss), n rows from o.
  void add_out_bias(const LayerWeights& L, float* o, int64_t n) {
    if (L.bo.empty()) return;
    const int64_t E = m.cfg_.n_embd;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < E; ++i) o[r * E + i] += L.bo[i];
  }

  // x += o for every row going on, o normed first where the model norms a
  // block's output (Gemma 3's sandwich norm); then xn = norm(x) by
  // `next_norm` where the next block reads it.
  void add_residual(const float* post_norm, const float* next_norm) {
    const ModelConfig& c = m.cfg_;
    Scratch& s = *m.s_;
    const int64_t E = c.n_embd;
    pool.parallel_for(R, 8, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        float* o = s.o.data() + r * E;
        float* x = s.x.data() + r * E;
        if (c.sandwich_norm) rms_norm_at(m.level_, o, post_norm, E, c.rms_eps, o);
        for (int64_t i = 0; i < E; ++i) x[i] += o[i];
        if (next_norm) rms_norm_at(m.level_, x, next_norm, E, c.rms_eps, s.xn.data() + r * E);
      }
    });
  }

  void attention_residual(int32_t il) {
    if (R == 0) return;
    const LayerWeights& L = m.w_.layers[il];
    add_residual(L.post_attn_norm.data(), L.ffn_norm.data());
  }

  void feed_forward(int32_t il) {
    if (R == 0) return;
    const ModelConfig& c = m.cfg_;
    const LayerWeights& L = m.w_.layers[il];
    Scratch& s = *m.s_;
    const int64_t E = c.n_embd;
    if (L.moe) {
      const MoeShape shape = MoeShape::of(c);
      for (int64_t c0 = 0; c0 < R; c0 += kMoeChunkRows) {
        const int64_t n = std::min(kMoeChunkRows, R - c0);
        s.moe.run(L.moe, shape, s.xn.data() + c0 * E, E, n, s.o.data() + c0 * E, E, s.mm, pool);
      }
      return;
    }
    // In chunks of rows: the gate and up rows (2 x n_ff floats each) are the
    // widest activations, and a long prompt's would set the peak memory. A
    // row's result does not depend on the rows computed beside it.
    const int64_t F = c.n_ff;
    const int64_t CR = std::min(R, kFfnChunkRows);
    s.gate.resize(CR * F);
    s.up.resize(CR * F);
    for (int64_t c0 = 0; c0 < R; c0 += CR) {
      const int64_t n = std::min(CR, R - c0);
      const WeightMatrix* gate_up[] = {&L.w_gate, &L.w_up};
      float* const gate_up_out[] = {s.gate.data(), s.up.data()};
      const int64_t gate_up_ld[] = {F, F};
      s.mm.run_many(gate_up, s.xn.data() + c0 * E, E, n, gate_up_out, gate_up_ld, pool);
      pool.parallel_for(n, 4, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
          gated_activation_at(m.level_, c.act, s.gate.data() + r * F, s.up.data() + r * F, F);
      });
      s.mm.run(L.w_down, s.gate.data(), F, n, s.o.data() + c0 * E, E, pool);
    }
  }

  void ffn_residual(int32_t il) {
    if (R == 0) return;
    add_residual(m.w_.layers[il].post_ffn_norm.data(), nullptr);
  }
};

void check_batch(const Batch& batch, std::span<SeqKv* const> seqs, int32_t n_vocab, int32_t block_size,
                 const KvPaging& pg, size_t logits_floats) {
  for (size_t r = 0; r < batch.size(); ++r) {
    const BatchRow& row = batch[r];
    if (row.token < 0 || row.token >= n_vocab)
      fail(ErrorKind::kInvalidArgument, "token id {} is outside the vocabulary (0..{})", row.token, n_vocab - 1);
    if (row.seq < 0 || row.seq >= static_cast<int32_t>(seqs.size()))
      fail(ErrorKind::kInvalidArgument, "batch row names sequence {} of {}", row.seq, seqs.size());
    const SeqKv& sk = *seqs[row.seq];
    if (row.pos < 0 || row.pos >= static_cast<int64_t>(sk.blocks.size()) * block_size)
      fail(ErrorKind::kInvalidArgument, "position {} has no KV block reserved", row.pos);
    // A windowed group's table may have given back pages its window has
    // passed, never one this row's attention reads.
    if (sk.windowed.size() != size_t(pg.n_windowed()))
      fail(ErrorKind::kInvalidArgument, "sequence has {} windowed block tables, the cache {} groups of them",
           sk.windowed.size(), pg.n_windowed());
    for (const auto& t : sk.windowed)
      for (int32_t p = std::max(0, row.pos - pg.window + 1) / block_size; p <= row.pos / block_size; ++p)
        if (p >= static_cast<int32_t>(t.size()) || t[p] < 0)
          fail(ErrorKind::kInvalidArgument, "position {} of a sliding-window layer has no KV block", row.pos);
    if (r > 0 && batch[r - 1].seq == row.seq && batch[r - 1].pos + 1 != row.pos)
      fail(ErrorKind::kInvalidArgument, "rows of sequence {} are not at consecutive positions", row.seq);
  }
  const size_t n_out = rows_with_logits(batch);
  if (logits_floats < n_out * static_cast<size_t>(n_vocab))
    fail(ErrorKind::kInvalidArgument, "forward: {} rows want logits but the buffer holds {} floats", n_out,
         logits_floats);
}

void Model::forward(const Batch& batch, std::span<SeqKv* const> seqs, KvCache& kv, ThreadPool& pool,
                    Logits& logits) {
  const size_t base = logits.size();
  logits.resize(base + rows_with_logits(batch) * static_cast<size_t>(cfg_.n_vocab));
  forward(batch, seqs, kv, pool, std::span<float>(logits).subspan(base));
}

void Model::forward(const Batch& batch, std::span<SeqKv* const> seqs, KvCache& kv, ThreadPool& pool,
                    std::span<float> out) {
  const ModelConfig& c = cfg_;
  const int64_t R = static_cast<int64_t>(batch.size());
  if (R == 0) return;
  check_batch(batch, seqs, c.n_vocab, kv.block_size(), kv.paging(), out.size());

  Scratch& s = *s_;
  const int64_t E = c.n_embd;
  s.x.resize(R * E);
  s.xn.resize(R * E);
  // The embedding rows on this thread: a row is one read and a dequantization
  // of n_embd values, about a microsecond against the ~150 ms of a 512-token
  // prompt's pass (bench -p 512 shows no difference beyond its noise).
  const WeightMatrix& T = w_.tok_embd;
  std::vector<uint8_t>& file_bytes = s.embd_row;
  for (int64_t r = 0; r < R; ++r) {
    float* xr = s.x.data() + r * E;
    const uint8_t* file_row = nullptr;
    if (T.layout == WeightLayout::kFileRows) {
      // Read, not faulted in (GgufFile::copy_out): faults would keep most
      // of the embedding resident for a prompt's scattered rows.
      file_bytes.resize(T.row_stride);
      file_->copy_out(T.row(batch[r].token), T.row_stride, file_bytes.data());
      file_row = file_bytes.data();
    }
    dequantize_weight_row(T, batch[r].token, xr, file_row);
    if (c.embed_scale != 1.0f)
      for (int64_t i = 0; i < E; ++i) xr[i] *= c.embed_scale;
  }

  // Logits only for the rows that asked: in prefill that is the last row, so
  // the vocab-sized product runs once, not N times. The last layer only
  // writes the other rows' K and V: their attention output and feed-forward
  // would feed nothing (a 512-token prompt of the 1.1B skips ~1/22 of its
  // products).
  std::vector<int64_t>& want = s.want;
  want.clear();
  for (int64_t r = 0; r < R; ++r)
    if (batch[r].logits) want.push_back(r);
  const bool compacted = static_cast<int64_t>(want.size()) < R;  // by the last layer
  LayerSteps steps{*this, batch, seqs, kv, pool, nullptr, R};
  for (int32_t il = 0; il < c.n_layer; ++il) {
    if (il + 1 == c.n_layer && compacted) steps.keep = &want;
    decoder_layer(steps, il);
  }
  for (size_t i = 0; i < want.size(); ++i)
    rms_norm_at(level_, s.x.data() + (compacted ? static_cast<int64_t>(i) : want[i]) * E, w_.output_norm.data(), E,
                c.rms_eps, s.xn.data() + i * E);
  s.mm.run(w_.output, s.xn.data(), E, static_cast<int64_t>(want.size()), out.data(), c.n_vocab, pool);

  for (int64_t r = 0; r < R; ++r) {
    SeqKv& sk = *seqs[batch[r].seq];
    sk.n_tokens = std::max(sk.n_tokens, batch[r].pos + 1);
  }
}

namespace {

RopeParams layer_rope(const ModelConfig& c, const ModelWeights& w, int32_t il) {
  const bool swa = c.layer_is_swa[il];
  RopeParams rope;
  rope.style = c.rope_style;
  rope.dims = c.rope_dims;
  rope.base = swa ? c.rope_base_swa : c.rope_base;
  rope.scale = swa ? c.rope_scale_swa : c.rope_scale;
  rope.freq_factors = w.rope_freqs.empty() ? nullptr : w.rope_freqs.data();
  rope.yarn = c.rope_yarn;
  rope.yarn_low = c.yarn_low;
  rope.yarn_high = c.yarn_high;
  return rope;
}

}  // namespace

RopeParams Model::rope_params(int32_t il) const { return layer_rope(cfg_, w_, il); }

void Model::rope_shift_keys(int32_t il, float* k, int64_t stride, int32_t n, int32_t delta) const {
  const RopeParams rope = layer_rope(cfg_, w_, il);
  std::vector<float> cs(size_t(cfg_.rope_dims / 2)), sn(cs.size());
  rope_angles(rope, delta, cs.data(), sn.data());
  for (int32_t i = 0; i < n; ++i)
    for (int32_t h = 0; h < cfg_.n_head_kv; ++h)
      rope_apply(rope, cs.data(), sn.data(), k + i * stride + h * cfg_.head_dim);
}

// Rows [c0, c0 + n) of the batch (normed in s.xn) through one layer's
// attention, up to its output projection: q, k, v; rope; the KV cache
// writes; attention (prefill runs of a sequence together, decode rows
// gathered) into s.attn, n rows.
void Model::attention_rows(int32_t il, const Batch& batch, int64_t c0, int64_t n, std::span<SeqKv* const> seqs,
                           KvCache& kv, ThreadPool& pool) {
  const ModelConfig& c = cfg_;
  const LayerWeights& L = w_.layers[il];
  Scratch& s = *s_;
  const int64_t E = c.n_embd;
  const int64_t QW = int64_t{c.n_head} * c.head_dim, KW = int64_t{c.n_head_kv} * c.head_dim;
  const int64_t VW = int64_t{c.n_head_kv} * c.head_dim_v, OW = int64_t{c.n_head} * c.head_dim_v;
  const bool swa = c.layer_is_swa[il];
  const RopeParams rope = layer_rope(c, w_, il);
  const int32_t half = c.rope_dims / 2;
  const AttnShape shape{c.n_head, c.n_head_kv, c.head_dim, c.head_dim_v, swa ? c.sliding_window : 0,
                        L.sinks.empty() ? nullptr : L.sinks.data()};
  if (c.latent_attention()) {
    if (static_cast<int64_t>(s.attn.size()) < n * OW) s.attn.resize(n * OW);
    latent_attention_rows(il, batch, c0, n, seqs, kv, pool, s.xn.data() + c0 * E, s.attn.data());
    return;
  }
  // Sized for the chunk; they only grow, so that a short last chunk does not
  // make the next layer's first one zero-fill them again.
  for (auto [buf, width] : {std::pair{&s.q, QW}, {&s.k, KW}, {&s.v, VW}, {&s.rope_cos, int64_t{half}},
                            {&s.rope_sin, int64_t{half}}, {&s.attn, OW}})
    if (static_cast<int64_t>(buf->size()) < n * width) buf->resize(n * width);

  // One parallel region for the three projections: one barrier instead of
  // three, and K and V (a few tiles each) are no longer products too small
  // to split evenly.
  const WeightMatrix* qkv[] = {&L.wq, &L.wk, &L.wv};
  float* const qkv_out[] = {s.q.data(), s.k.data(), s.v.data()};
  const int64_t qkv_ld[] = {QW, KW, VW};
  s.mm.run_many(qkv, s.xn.data() + c0 * E, E, n, qkv_out, qkv_ld, pool);

  pool.parallel_for(n, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* q = s.q.data() + r * QW;
      float* k = s.k.data() + r * KW;
      float* v = s.v.data() + r * VW;
      const BatchRow& row = batch[c0 + r];
      if (c.qkv_bias) {
        for (int64_t i = 0; i < QW; ++i) q[i] += L.bq[i];
        for (int64_t i = 0; i < KW; ++i) k[i] += L.bk[i];
        for (int64_t i = 0; i < VW; ++i) v[i] += L.bv[i];
      }
      if (c.qk_norm) {
        for (int32_t h = 0; h < c.n_head; ++h)
          rms_norm_at(level_, q + h * c.head_dim, L.q_norm.data(), c.head_dim, c.rms_eps, q + h * c.head_dim);
        for (int32_t h = 0; h < c.n_head_kv; ++h)
          rms_norm_at(level_, k + h * c.head_dim, L.k_norm.data(), c.head_dim, c.rms_eps, k + h * c.head_dim);
      }
      float* cs = s.rope_cos.data() + r * half;
      float* sn = s.rope_sin.data() + r * half;
      rope_angles(rope, row.pos + seqs[row.seq]->rope_shift, cs, sn);
      for (int32_t h = 0; h < c.n_head; ++h) {
        rope_apply(rope, cs, sn, q + h * c.head_dim);
        for (int32_t i = 0; i < c.head_dim; ++i) q[h * c.head_dim + i] *= c.attn_scale;
      }
      kv.rotate_queries(il, q, c.n_head, c.head_dim);
      for (int32_t h = 0; h < c.n_head_kv; ++h) rope_apply(rope, cs, sn, k + h * c.head_dim);

      const SeqKv& sk = *seqs[row.seq];
      const int32_t block = sk.table(kv.group(il))[row.pos / kv.block_size()], slot = row.pos % kv.block_size();
      kv.write(il, block, slot, k, v);
    }
  });
  // A block's key bounds are written once its last slot is (after the
  // parallel writes above: a block's other slots may have been written by
  // other threads).
  KeyBounds* bounds = kv.key_bounds();
  const bool sparse_layer = bounds && bounds->has(il);
  if (sparse_layer) {
    for (int64_t r = 0; r < n; ++r) {
      const BatchRow& row = batch[c0 + r];
      if (row.pos % kv.block_size() == kv.block_size() - 1)
        bounds->update(kv, il, seqs[row.seq]->table(kv.group(il))[row.pos / kv.block_size()]);
    }
  }
  if (query_energy_) {
    double* e = query_energy_->data() + il * QW;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < QW; ++i) e[i] += double(s.q[r * QW + i]) * s.q[r * QW + i];
  }

  auto view_of = [&](const SeqKv& sk) { return kv.layer_view(il, sk.table(kv.group(il))); };
  s.views.clear();
  s.positions.clear();
  s.decode_rows.clear();
  s.decode_mass.clear();
  s.sparse_rows.clear();
  size_t sparse_table_size = 0;
  bool any_mass = false;
  for (int64_t r0 = 0; r0 < n;) {
    int64_t r1 = r0 + 1;
    while (r1 < n && batch[c0 + r1].seq == batch[c0 + r0].seq) ++r1;
    const SeqKv& sk = *seqs[batch[c0 + r0].seq];
    // Rows from sparse_from on are attended one by one, each with the blocks
    // its query selects (the rows before, a prompt, stay dense): a verified
    // draft's row sees what plain decoding of its position would.
    int64_t r_sparse = r1;
    if (sparse_layer && sk.sparse_budget > 0 && !sk.attn_mass)
      r_sparse = std::clamp<int64_t>(r0 + (sk.sparse_from - batch[c0 + r0].pos), r0, r1);
    if (r_sparse - r0 > 1) {
      attention_prefill_at(level_, shape, view_of(sk), s.q.data() + r0 * QW, QW, batch[c0 + r0].pos,
                           static_cast<int32_t>(r_sparse - r0), s.attn.data() + r0 * OW, OW, pool, sk.attn_mass);
    } else if (r_sparse - r0 == 1) {
      s.views.push_back(view_of(sk));
      s.positions.push_back(batch[c0 + r0].pos);
      s.decode_rows.push_back(r0);
      s.decode_mass.push_back(sk.attn_mass);
      any_mass |= sk.attn_mass != nullptr;
    }
    for (int64_t r = r_sparse; r < r1; ++r) {
      const int32_t pos = batch[c0 + r].pos;
      SparseAttention o = opts_.sparse_attention;
      o.budget = sk.sparse_budget;
      const int32_t n_table = sparse_table_blocks(o, pos, kv.block_size());
      const int64_t held = pos / kv.block_size() + 1;
      sparse_counts_.held += held * c.n_head_kv;
      sparse_counts_.read += (n_table > 0 ? n_table : held) * c.n_head_kv;
      if (n_table > 0) {
        s.sparse_rows.push_back({static_cast<int64_t>(s.views.size()), &sk, n_table, sparse_table_size});
        sparse_table_size += size_t(n_table) * c.n_head_kv;
      }
      s.views.push_back(view_of(sk));
      s.positions.push_back(pos);
      s.decode_rows.push_back(r);
      s.decode_mass.push_back(nullptr);
    }
    r0 = r1;
  }
  if (!s.sparse_rows.empty()) {
    // Each (row, KV head) selects its blocks; the row then reads its tables
    // as a sequence of n_table blocks, at the same offset in the last one.
    s.sparse_tables.resize(sparse_table_size);
    const int32_t group = c.n_head / c.n_head_kv, bs = kv.block_size();
    const int64_t n_units = static_cast<int64_t>(s.sparse_rows.size()) * c.n_head_kv;
    pool.parallel_for(n_units, 1, [&](int64_t u0, int64_t u1) {
      thread_local std::vector<float> scores;
      thread_local std::vector<int32_t> index;
      for (int64_t u = u0; u < u1; ++u) {
        const Scratch::SparseRow& sr = s.sparse_rows[u / c.n_head_kv];
        const int32_t h = static_cast<int32_t>(u % c.n_head_kv);
        const int32_t pos = s.positions[sr.b];
        if (scores.size() < size_t(pos / bs + 1)) {
          scores.resize(pos / bs + 1);
          index.resize(pos / bs + 1);
        }
        SparseAttention o = opts_.sparse_attention;
        o.budget = sr.sk->sparse_budget;
        select_blocks(level_, o, pos, bs, sr.sk->table(kv.group(il)),
                      s.q.data() + s.decode_rows[sr.b] * QW + int64_t{h} * group * c.head_dim, group, c.head_dim,
                      c.head_dim, bounds->base(il, h), bounds->block_stride(), scores.data(), index.data(),
                      s.sparse_tables.data() + sr.at + size_t(h) * sr.n_table);
      }
    });
    for (const Scratch::SparseRow& sr : s.sparse_rows) {
      KvLayerView& v = s.views[sr.b];
      v.blocks = s.sparse_tables.data() + sr.at;
      v.head_table_stride = sr.n_table;
      s.positions[sr.b] = (sr.n_table - 1) * bs + s.positions[sr.b] % bs;
    }
  }
  if (!s.decode_rows.empty()) {
    // Decode rows may be scattered among prefill chunks; gather them so one
    // parallel loop covers all of them.
    const int64_t B = static_cast<int64_t>(s.decode_rows.size());
    s.q_decode.resize(B * QW);
    s.out_decode.resize(B * OW);
    for (int64_t b = 0; b < B; ++b)
      std::copy_n(s.q.data() + s.decode_rows[b] * QW, QW, s.q_decode.data() + b * QW);
    attention_decode_at(level_, shape, s.views.data(), s.positions.data(), static_cast<int32_t>(B), s.q_decode.data(),
                        QW, s.out_decode.data(), OW, pool, any_mass ? s.decode_mass.data() : nullptr);
    for (int64_t b = 0; b < B; ++b)
      std::copy_n(s.out_decode.data() + b * OW, OW, s.attn.data() + s.decode_rows[b] * OW);
  }
  if (kv.format().rotate_v)
    pool.parallel_for(n, 4, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) kv.unrotate_outputs(s.attn.data() + r * OW, c.n_head, c.head_dim_v);
    });
}

void Model::prefill(SeqKv& seq, std::span<const int32_t> tokens, KvCache& kv, ThreadPool& pool,
                    Logits& logits) {
  Batch b(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) b[i] = {tokens[i], seq.n_tokens + static_cast<int32_t>(i), 0, false};
  if (!b.empty()) b.back().logits = true;
  SeqKv* one[] = {&seq};
  forward(b, one, kv, pool, logits);
}

void Model::decode(std::span<SeqKv* const> seqs, std::span<const int32_t> tokens, KvCache& kv, ThreadPool& pool,
                   Logits& logits) {
  if (tokens.size() != seqs.size())
    fail(ErrorKind::kInvalidArgument, "decode: {} tokens for {} sequences", tokens.size(), seqs.size());
  Batch b(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) b[i] = {tokens[i], seqs[i]->n_tokens, static_cast<int32_t>(i), true};
  forward(b, seqs, kv, pool, logits);
}

}  // namespace tandem
