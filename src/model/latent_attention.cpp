// Multi-head latent attention, as llama.cpp's deepseek2 graph computes it
// with its split up-projections (attn_k_b / attn_v_b): q and the compressed
// kv from the normed rows; the latent normed, the shared key part and each
// head's rope part rotated; each head's key up-projection absorbed into its
// query; attention over the cached latents; each head's output through its
// value up-projection. Every phase attends over the latent (prefill does not
// expand per head): one kernel, one order of arithmetic for every token.
#include "model/latent_attention.h"

#include <algorithm>

#include "kernels/latent_attention.h"
#include "kernels/ops.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "runtime/thread_pool.h"

namespace tandem {
namespace {

// Rows [r0, r0 + count) of W, read in the file's layout.
WeightMatrix row_slice(const WeightMatrix& W, int64_t r0, int64_t count) {
  WeightMatrix s = W;
  s.data = W.row(r0);
  s.rows = count;
  s.set_layout(WeightLayout::kFileRows, nullptr);
  return s;
}

void grow(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

}  // namespace

void Model::latent_attention_rows(int32_t il, const Batch& batch, int64_t c0, int64_t n,
                                  std::span<SeqKv* const> seqs, KvCache& kv, ThreadPool& pool, const float* xn,
                                  float* attn) {
  const ModelConfig& c = cfg_;
  const LayerWeights& L = w_.layers[il];
  LatentScratch& s = *latent_;
  const int64_t E = c.n_embd, H = c.n_head, Dk = c.head_dim, Dv = c.head_dim_v, R = c.rope_dims;
  const int64_t nope = Dk - R, KL = c.kv_lora_rank, QL = c.q_lora_rank;
  const int64_t QW = H * Dk, AW = KL + R, CW = H * AW, LW = H * KL, OW = H * Dv;
  const int32_t half = c.rope_dims / 2;
  grow(s.q, n * QW);
  grow(s.kva, n * AW);
  grow(s.qcat, n * CW);
  grow(s.lat, n * LW);
  grow(s.rope_cos, n * half);
  grow(s.rope_sin, n * half);

  // q (through the q LoRA where the model has one) and the compressed kv.
  if (QL > 0) {
    grow(s.q_a, n * QL);
    const WeightMatrix* Ws[] = {&L.wq_a, &L.wk};
    float* const outs[] = {s.q_a.data(), s.kva.data()};
    const int64_t lds[] = {QL, AW};
    s.mm.run_many(Ws, xn, E, n, outs, lds, pool);
    pool.parallel_for(n, 8, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        rms_norm_at(level_, s.q_a.data() + r * QL, L.q_a_norm.data(), QL, c.rms_eps, s.q_a.data() + r * QL);
    });
    s.mm.run(L.wq, s.q_a.data(), QL, n, s.q.data(), QW, pool);
  } else {
    const WeightMatrix* Ws[] = {&L.wq, &L.wk};
    float* const outs[] = {s.q.data(), s.kva.data()};
    const int64_t lds[] = {QW, AW};
    s.mm.run_many(Ws, xn, E, n, outs, lds, pool);
  }

  // The latent normed, the rope parts rotated; the token's latent and shared
  // key part into the cache.
  const RopeParams rope = rope_params(il);
  pool.parallel_for(n, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const BatchRow& row = batch[c0 + r];
      const SeqKv& sk = *seqs[row.seq];
      float* a = s.kva.data() + r * AW;
      rms_norm_at(level_, a, L.kv_a_norm.data(), KL, c.rms_eps, a);
      float* cs = s.rope_cos.data() + r * half;
      float* sn = s.rope_sin.data() + r * half;
      rope_angles(rope, row.pos + sk.rope_shift, cs, sn);
      rope_apply(rope, cs, sn, a + KL);
      for (int64_t h = 0; h < H; ++h) rope_apply(rope, cs, sn, s.q.data() + r * QW + h * Dk + nope);
      // YaRN's magnitude factor on the rotated parts (ggml scales cos and sin).
      if (c.rope_mscale != 1.0f) {
        for (int64_t i = 0; i < R; ++i) a[KL + i] *= c.rope_mscale;
        for (int64_t h = 0; h < H; ++h)
          for (int64_t i = 0; i < R; ++i) s.q[r * QW + h * Dk + nope + i] *= c.rope_mscale;
      }
      const int32_t block = sk.table(kv.group(il))[row.pos / kv.block_size()], slot = row.pos % kv.block_size();
      kv.write(il, block, slot, a + KL, a);
    }
  });

  // Each head's unrotated query through its key up-projection (transposed):
  // q_nope . (W_kb latent) = (W_kb^T q_nope) . latent.
  for (int64_t h = 0; h < H; ++h)
    s.mm.run(row_slice(L.k_b, h * KL, KL), s.q.data() + h * Dk, QW, n, s.qcat.data() + h * AW, CW, pool);
  pool.parallel_for(n, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t h = 0; h < H; ++h) {
        float* qc = s.qcat.data() + r * CW + h * AW;
        std::copy_n(s.q.data() + r * QW + h * Dk + nope, R, qc + KL);
        for (int64_t i = 0; i < AW; ++i) qc[i] *= c.attn_scale;
      }
  });

  const LatentShape shape{c.n_head, c.kv_lora_rank, c.rope_dims};
  for (int64_t r0 = 0; r0 < n;) {
    int64_t r1 = r0 + 1;
    while (r1 < n && batch[c0 + r1].seq == batch[c0 + r0].seq) ++r1;
    const SeqKv& sk = *seqs[batch[c0 + r0].seq];
    latent_attention(shape, kv.layer_view(il, sk.table(kv.group(il))), s.qcat.data() + r0 * CW, CW,
                     batch[c0 + r0].pos, static_cast<int32_t>(r1 - r0), s.lat.data() + r0 * LW, LW, pool);
    r0 = r1;
  }

  // Each head's latent output through its value up-projection.
  for (int64_t h = 0; h < H; ++h)
    s.mm.run(row_slice(L.v_b, h * L.v_b_pitch + L.v_b_offset, Dv), s.lat.data() + h * KL, LW, n, attn + h * Dv, OW,
             pool);
}

}  // namespace tandem
