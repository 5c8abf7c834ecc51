#include "kernels/matmul.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/error.h"
#include "runtime/thread_pool.h"
#include "kernels/products.h"
#include "kernels/vec_dot.h"
#include "kernels/stream_tuning.h"

namespace tandem {
namespace {

// Panel bytes per K chunk: fits L1 with room for the activations streaming
// past it, so the packed weights are read from L1 by every row tile.
constexpr size_t kPanelBytes = 32 * 1024;

// Weight rows per range in the fallback path.
constexpr int64_t kFallbackRows = 16;

}  // namespace

Matmul::Matmul(KernelLevel level, const StreamTuning& tuning) : level_(level), tuning_(tuning) {}

void Matmul::run(const WeightMatrix& W, const float* x, int64_t ldx, int64_t n_rows, float* y, int64_t ldy,
                 ThreadPool& pool) {
  const WeightMatrix* Ws[] = {&W};
  float* ys[] = {y};
  const int64_t lds[] = {ldy};
  run_many(Ws, x, ldx, n_rows, ys, lds, pool);
}

void Matmul::run_many(std::span<const WeightMatrix* const> Ws, const float* x, int64_t ldx, int64_t n_rows,
                      std::span<float* const> ys, std::span<const int64_t> ldys, ThreadPool& pool) {
  if (n_rows <= 0 || Ws.empty()) return;
  if (ys.size() != Ws.size() || ldys.size() != Ws.size())
    fail(ErrorKind::kInvalidArgument, "matmul: {} matrices but {} outputs and {} strides", Ws.size(), ys.size(),
         ldys.size());
  const WeightMatrix& W0 = *Ws[0];
  bool mixed = false;
  for (const WeightMatrix* W : Ws) {
    if (W->cols != W0.cols)
      fail(ErrorKind::kInvalidArgument, "matmul: matrices of one call must share their width ({} vs {} columns)",
           W->cols, W0.cols);
    mixed |= W->type != W0.type;
  }
  if (mixed) {
    // One call per weight type, each quantizing the input once for its type.
    for (size_t i = 0; i < Ws.size(); ++i) {
      bool seen = false;
      for (size_t j = 0; j < i; ++j) seen |= Ws[j]->type == Ws[i]->type;
      if (seen) continue;
      std::vector<const WeightMatrix*> w;
      std::vector<float*> y;
      std::vector<int64_t> ld;
      for (size_t j = i; j < Ws.size(); ++j)
        if (Ws[j]->type == Ws[i]->type) {
          w.push_back(Ws[j]);
          y.push_back(ys[j]);
          ld.push_back(ldys[j]);
        }
      run_many(w, x, ldx, n_rows, y, ld, pool);
    }
    return;
  }

  // One layout for the call: the one its matrices share (a mix plans as the
  // file's rows; each matrix is still read from where it is).
  WeightLayout layout = W0.layout;
  for (const WeightMatrix* W : Ws)
    if (W->layout != layout) layout = WeightLayout::kFileRows;
  const Product product = select_product(W0.type, layout, n_rows, level_, tuning_);
  for (const WeightMatrix* W : Ws)
    if (W->tiles() && !product.kernel.reads_tiles)
      fail(ErrorKind::kInvalidArgument, "matmul: {} weights in the tiles layout need the AVX-512 kernels, not {}",
           type_traits(W0.type).name, kernel_level_name(level_));
  if (product.route == ProductRoute::kVecDot) {
    for (size_t i = 0; i < Ws.size(); ++i) run_fallback(*Ws[i], x, ldx, n_rows, ys[i], ldys[i], product.dot, pool);
    return;
  }
  const GemmKernel& kern = product.kernel;
  const bool prepacked = product.prepacked();
  const bool packed = product.route == ProductRoute::kPanels;
  GemmActs& A = acts_;
  gemm_acts_shape(W0.type, n_rows, W0.cols, packed ? kGemmMaxRows : 1, A);
  A.prefetch = tuning_.software_prefetch;
  A.float_single_row = tuning_.float_single_row;
  pool.parallel_for(A.groups, 1, [&](int64_t g0, int64_t g1) { gemm_prepare_acts(x, ldx, g0, g1, A, level_); });

  // Tiles of all matrices in one list, so the threads share one region.
  std::vector<int64_t>& first_tile = first_tile_;
  first_tile.assign(Ws.size() + 1, 0);
  for (size_t i = 0; i < Ws.size(); ++i)
    first_tile[i + 1] = first_tile[i] + (Ws[i]->rows + kGemmTile - 1) / kGemmTile;
  const int64_t n_tiles = first_tile.back();

  // Tapering ranges for products of one or two row groups, so the threads
  // finish a short product together; more groups keep equal ranges, since
  // each range break costs the last group's L2 prefetch of the next chunk
  // (below). docs/performance.md has the measurements.
  const bool guided = A.groups <= 2;
  if (!packed) {
    pool.parallel_chunks_guided(n_tiles, 1, [&](int, int64_t t0, int64_t t1) {
      // The range may span matrices: one call per matrix it touches.
      size_t m = 0;
      while (t0 < t1) {
        while (t0 >= first_tile[m + 1]) ++m;
        const int64_t te = std::min(t1, first_tile[m + 1]);
        const WeightMatrix& W = *Ws[m];
        const int64_t o0 = (t0 - first_tile[m]) * kGemmTile;
        const int64_t o1 = std::min(W.rows, (te - first_tile[m]) * kGemmTile);
        kern.rows(W, o0, o1, A, 0, n_rows, ys[m], ldys[m]);
        t0 = te;
      }
    });
    return;
  }

  const int64_t nb = A.nb;
  // K in equal chunks whose panel fits kPanelBytes.
  const int64_t max_chunk = std::max<int64_t>(1, static_cast<int64_t>(kPanelBytes / kern.panel_block_bytes));
  // Prepacked panels read by one group of rows need no chunking: each
  // panel byte is used once, straight from memory.
  const int64_t n_chunks = prepacked && A.groups == 1 ? 1 : (nb + max_chunk - 1) / max_chunk;
  const int64_t chunk = (nb + n_chunks - 1) / n_chunks;
  const int64_t panel_lines = (chunk * static_cast<int64_t>(kern.panel_block_bytes) + 63) / 64;
  const StreamTuning& tuning = tuning_;
  // Two tiles per kernel call (32 weight rows) where the kernel can: each
  // activation broadcast then feeds two dot products.
  const bool pairs = product.pairs;
  const int span_max = pairs ? 2 : 1;
  if (scratch_.size() < static_cast<size_t>(pool.size())) scratch_.resize(pool.size());
  const size_t acc_floats = static_cast<size_t>(A.groups * A.slots * kGemmTile);
  for (ThreadScratch& s : scratch_) {
    if (s.panel.size() < static_cast<size_t>(span_max * panel_lines)) s.panel.resize(span_max * panel_lines);
    if (s.acc.size() < span_max * acc_floats) s.acc.resize(span_max * acc_floats);
  }

  // Prefetch on the first pass over prepacked panels (one packed just now is
  // in L1). With several row groups, the last one reads the chunk from L1
  // while the memory system is idle: it prefetches the bytes that follow
  // (the next chunk, or the next unit's first) into L2, and the first group
  // of the next call, finding them there, prefetches nothing.
  const int64_t pbb = static_cast<int64_t>(kern.panel_block_bytes);
  // Outputs too large for any cache, on cache lines, go out with streaming
  // stores (StreamTuning::stream_out_min_bytes): no line is read before it
  // is overwritten.
  std::vector<char>& stream_y = stream_y_;
  stream_y.assign(Ws.size(), 0);
  for (size_t i = 0; i < Ws.size(); ++i)
    stream_y[i] = tuning.stream_out_min_bytes >= 0 &&
                  n_rows * Ws[i]->rows * static_cast<int64_t>(sizeof(float)) >= tuning.stream_out_min_bytes &&
                  reinterpret_cast<uintptr_t>(ys[i]) % 64 == 0 && ldys[i] % 16 == 0;
  auto run_tiles = [&](int t, int64_t t0, int64_t t1) {
    ThreadScratch& s = scratch_[t];
    bool streamed = false;
    const uint8_t* prefetched = nullptr;  // where the last call's prefetches ended
    size_t m = 0;
    int span = 1;
    for (int64_t tile = t0; tile < t1; tile += span) {
      while (tile >= first_tile[m + 1]) ++m;
      const WeightMatrix& W = *Ws[m];
      const int64_t o0 = (tile - first_tile[m]) * kGemmTile;
      const int64_t width = std::min<int64_t>(kGemmTile, W.rows - o0);
      // A pair: two whole tiles of one matrix, both in this range.
      span = pairs && tile + 1 < t1 && tile + 1 < first_tile[m + 1] && o0 + 2 * kGemmTile <= W.rows ? 2 : 1;
      float* y = ys[m] + o0;
      for (int64_t c0 = 0; c0 < nb; c0 += chunk) {
        const int64_t c1 = std::min(nb, c0 + chunk);
        const int64_t chunk_bytes = (c1 - c0) * pbb;
        const uint8_t* p[2];
        for (int i = 0; i < span; ++i) {
          if (W.panels()) {
            p[i] = W.panels() + ((tile + i - first_tile[m]) * nb + c0) * pbb;
          } else {
            uint8_t* dst = s.panel.data()->bytes + i * panel_lines * 64;
            kern.pack(W, o0 + i * kGemmTile, c0, c1, dst);
            p[i] = dst;
          }
        }
        const bool in_l2 = W.panels() && p[0] == prefetched;
        prefetched = nullptr;
        // The last group's prefetch: each panel's next chunk, or after the
        // last chunk the next unit's first, span tiles on (for one tile the
        // same as chunk_bytes ahead).
        const int64_t next_bytes = c1 == nb ? (span * nb - c0) * pbb : chunk_bytes;
        // Chains start from +0 in the first chunk, pass through the scratch
        // rows between chunks, and a full tile's last chunk writes y itself.
        const bool first = c0 == 0, last = c1 == nb;
        for (int64_t g = 0; g < A.groups; ++g) {
          const int R = static_cast<int>(std::min<int64_t>(A.slots, n_rows - g * A.slots));
          GemmAcc io[2];
          for (int i = 0; i < span; ++i) {
            float* scratch_rows = s.acc.data() + i * acc_floats + g * A.slots * kGemmTile;
            io[i].in = first ? nullptr : scratch_rows;
            if (W.panels() && g == 0 && !in_l2 && R >= tuning.panel_prefetch_min_rows)
              io[i].prefetch_bytes = tuning.panel_prefetch_bytes;
            if (W.panels() && g > 0 && g == A.groups - 1 && tuning.panel_prefetch_next) {
              io[i].prefetch_bytes = static_cast<int32_t>(next_bytes);
              io[i].prefetch_to_l2 = true;
              prefetched = p[0] + next_bytes;
            }
            if (last && width == kGemmTile) {
              io[i].out = y + i * kGemmTile + g * A.slots * ldys[m];
              io[i].ld_out = ldys[m];
              io[i].stream_out = stream_y[m] != 0;
              streamed |= io[i].stream_out;
            } else {
              io[i].out = scratch_rows;
            }
          }
          if (span == 2)
            kern.run2(p, c1 - c0, A, g, R, c0, io);
          else
            kern.run(p[0], c1 - c0, A, g, R, c0, io[0]);
        }
      }
      if (width < kGemmTile)
        for (int64_t r = 0; r < n_rows; ++r) std::copy_n(s.acc.data() + r * kGemmTile, width, y + r * ldys[m]);
    }
#if defined(__x86_64__)
    // Streaming stores are weakly ordered: drain them before the pool's
    // barrier tells another thread the outputs are there.
    if (streamed) _mm_sfence();
#else
    (void)streamed;
#endif
  };
  // Ranges in whole pairs, so that no pair is split between two ranges
  // (its tiles would run as two one-panel calls, the slower kernel).
  const int64_t unit = span_max;
  auto run_units = [&](int t, int64_t u0, int64_t u1) { run_tiles(t, u0 * unit, std::min(n_tiles, u1 * unit)); };
  const int64_t n_units = (n_tiles + unit - 1) / unit;
  if (guided) pool.parallel_chunks_guided(n_units, 1, run_units);
  else pool.parallel_chunks(n_units, 1, run_units);
}

void Matmul::run_fallback(const WeightMatrix& W, const float* x, int64_t ldx, int64_t n_rows, float* y, int64_t ldy,
                          VecDotFn dot, ThreadPool& pool) {
  const GgmlType at = vec_dot_type(W.type);
  const size_t act_stride = row_bytes(at, W.cols);
  if (act_.size() < act_stride * n_rows) act_.resize(act_stride * n_rows);
  uint8_t* act = act_.data();
  pool.parallel_for(n_rows, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) quantize_activations(at, x + r * ldx, act + r * act_stride, W.cols);
  });
  const int64_t n = W.cols;
  // A range of weight rows meets every activation row while it is in cache.
  pool.parallel_for(W.rows, kFallbackRows, [&](int64_t o0, int64_t o1) {
    for (int64_t t0 = o0; t0 < o1; t0 += kFallbackRows) {
      const int64_t t1 = std::min(o1, t0 + kFallbackRows);
      for (int64_t r = 0; r < n_rows; ++r) {
        const uint8_t* a = act + r * act_stride;
        float* yr = y + r * ldy;
        for (int64_t o = t0; o < t1; ++o) yr[o] = dot(n, W.row(o), a);
      }
    }
  });
}

}  // namespace tandem
