/* The element-wise tail and RMSNorm of a GCN layer as single loops over float32 rows,
 * and the evaluation's product by rows of a resident adjacency block.
 *
 * Built on first use and called through ctypes by dgl_scalegnn/parallel/cpu_kernels.py,
 * which declares each function's prototype (checked against the definitions here).
 * Each kernel reads its inputs once and writes its outputs once, where the eager torch
 * kernels make one pass per operation; the rows are split over the OpenMP threads
 * (the process's own OpenMP runtime: the library links the libgomp torch has loaded).
 * The forward follows the eager kernels of elementwise.py operation by operation (the
 * same float results); the inner loops are specialised for each combination of
 * switches, so that they have no branch and vectorise.
 */
#include <stdint.h>
#include <math.h>
#include <string.h>
#include <omp.h>

/* The dropout hash's multiplier (dropout_hash.py: _MIX). */
#define MIX 0x45D9F3Bu

#define INLINE static inline __attribute__((always_inline))

/* out[i] = sum_j x[i, j]^2 */
void row_square_sums(const float *restrict x, float *restrict out, int64_t rows,
                     int64_t cols, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    const float *restrict xi = x + i * cols;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < cols; ++j) sum += xi[j] * xi[j];
    out[i] = sum;
  }
}

/* One row of tail_forward; the switches are compile-time constants at every call.
 * yi may be xi (an evaluation writes the tail over its input): each element of yi is
 * computed from the same element of xi alone, in one simd loop with no dependence
 * between elements, so neither pointer is restrict. */
INLINE void tail_row(const float *xi, float r, const float *restrict gain,
                     float scale, const float *restrict ri, uint32_t row_bits,
                     const int32_t *restrict col_hash, int32_t threshold,
                     float *yi, uint8_t *restrict li, int64_t cols,
                     const int norm, const int relu, const int drop, const int res,
                     const int mask) {
#pragma omp simd
  for (int64_t j = 0; j < cols; ++j) {
    float z;
    if (norm) {
      z = (xi[j] * r) * gain[j];
      if (relu) z = z < 0.0f ? 0.0f : z; /* NaN stays NaN, as torch's relu */
    } else {
      z = xi[j] < 0.0f ? 0.0f : xi[j];
      if (drop) z *= scale;
    }
    if (drop) {
      const int32_t mixed = (int32_t)((row_bits ^ (uint32_t)col_hash[j]) * MIX);
      z *= (float)(mixed >= threshold); /* times 0 or 1, as the eager byte mask */
    }
    if (mask) {
      /* z >= 0: its bits as an integer are > 0 exactly where z > 0 (as eager) */
      int32_t bits;
      memcpy(&bits, &z, sizeof bits);
      li[j] = bits > 0;
    }
    yi[j] = res ? z + ri[j] : z;
  }
}

#define TAIL_CASE(k)                                                                   \
  case k:                                                                              \
    tail_row(xi, r, gain, scale, ri, row_bits, col_hash, threshold, yi, li, cols,      \
             (k >> 4) & 1, (k >> 3) & 1, (k >> 2) & 1, (k >> 1) & 1, k & 1);           \
    break;

/* tail_row with its switches (norm, relu, dropout, residual, mask: bits 4 to 0) made
 * constants: one branch-free loop for each combination. */
INLINE void tail_row_switched(int switches, const float *xi, float r,
                              const float *restrict gain, float scale,
                              const float *restrict ri, uint32_t row_bits,
                              const int32_t *restrict col_hash, int32_t threshold,
                              float *yi, uint8_t *restrict li, int64_t cols) {
  switch (switches) {
    TAIL_CASE(0) TAIL_CASE(1) TAIL_CASE(2) TAIL_CASE(3) TAIL_CASE(4) TAIL_CASE(5)
    TAIL_CASE(6) TAIL_CASE(7) TAIL_CASE(8) TAIL_CASE(9) TAIL_CASE(10) TAIL_CASE(11)
    TAIL_CASE(12) TAIL_CASE(13) TAIL_CASE(14) TAIL_CASE(15) TAIL_CASE(16)
    TAIL_CASE(17) TAIL_CASE(18) TAIL_CASE(19) TAIL_CASE(20) TAIL_CASE(21)
    TAIL_CASE(22) TAIL_CASE(23) TAIL_CASE(24) TAIL_CASE(25) TAIL_CASE(26)
    TAIL_CASE(27) TAIL_CASE(28) TAIL_CASE(29) TAIL_CASE(30) TAIL_CASE(31)
  }
}

/* y = dropout(relu(x * inv_rms[i] * gain[j])) + residual, live = 1 where the element
 * passed ReLU and dropout.  gain NULL: no norm, the element is relu(x) * scale.
 * compute_rms 1 (the rows' columns are all here): inv_rms[i] = (s / width + eps)^-1/2
 * from the row's square sum s, taken in the same pass while the row is in cache, and
 * written out (for backward); else inv_rms is read.  relu 0: no ReLU (the final
 * RMSNorm).  row_hash NULL: no dropout, else the element is kept where
 * (int32)((row_hash[i] ^ col_hash[j]) * MIX) >= threshold.  residual and live may be
 * NULL; y may be x (not residual). */
void tail_forward(const float *x, float *restrict inv_rms, int compute_rms,
                  float width, float eps, const float *restrict gain, float scale,
                  int relu, const float *restrict residual,
                  const int32_t *restrict row_hash, const int32_t *restrict col_hash,
                  int32_t threshold, float *y, uint8_t *restrict live,
                  int64_t rows, int64_t cols, int threads) {
  const int switches = (gain != NULL) << 4 | (relu != 0) << 3 | (row_hash != NULL) << 2 |
                       (residual != NULL) << 1 | (live != NULL);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    const float *xi = x + i * cols;
    float r = 1.0f;
    if (gain && compute_rms) {
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < cols; ++j) sum += xi[j] * xi[j];
      r = 1.0f / sqrtf(sum / width + eps); /* as torch.rsqrt */
      inv_rms[i] = r;
    } else if (gain) {
      r = inv_rms[i];
    }
    tail_row_switched(switches, xi, r, gain, scale, residual ? residual + i * cols : NULL,
                      row_hash ? (uint32_t)row_hash[i] : 0u, col_hash, threshold,
                      y + i * cols, live ? live + i * cols : NULL, cols);
  }
}

/* out[j] += x[j] * twice: one row's part of the gradient through its square sum. */
INLINE void add_scaled_row(float *restrict out, const float *restrict xi, float twice,
                           int64_t cols) {
#pragma omp simd
  for (int64_t j = 0; j < cols; ++j) out[j] += xi[j] * twice;
}

/* One row of norm_backward: returns sum_j m x gain and adds m x r into partial. */
INLINE float norm_backward_row(const float *restrict gi, const uint8_t *restrict li,
                               const float *restrict xi, float r,
                               const float *restrict gain, float *restrict partial,
                               float *restrict out, int64_t cols, const int mask) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < cols; ++j) {
    const float m = mask ? gi[j] * (float)li[j] : gi[j];
    const float mx = m * xi[j];
    sum += mx * gain[j];
    partial[j] += mx * r;
    out[j] = (m * gain[j]) * r;
  }
  return sum;
}

/* Backward of the normalised tail: with m = grad * live (live NULL: m = grad),
 * grad_x = m * gain[j] * inv_rms[i], the square sums' gradient
 * row_grad[i] = -inv_rms^3 / (2 width) * sum_j m x gain, and the gain's gradient
 * sum_i m x inv_rms added per thread into gain_partials[thread, :] (threads x cols,
 * zeroed by the caller).  finish 1 (the row's columns are all here): grad_x also gets
 * the square sums' part, 2 x row_grad[i], in the same pass over the row; finish 0:
 * the caller completes row_grad over the other columns first (add_row_scaled). */
void norm_backward(const float *restrict grad, const uint8_t *restrict live,
                   const float *restrict x, const float *restrict inv_rms,
                   const float *restrict gain, float width, float *restrict row_grad,
                   float *restrict gain_partials, float *restrict grad_x, int finish,
                   int64_t rows, int64_t cols, int threads) {
#pragma omp parallel num_threads(threads)
  {
    float *restrict partial = gain_partials + (int64_t)omp_get_thread_num() * cols;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows; ++i) {
      const float *restrict xi = x + i * cols;
      float *restrict out = grad_x + i * cols;
      const float r = inv_rms[i];
      const float sum =
          live ? norm_backward_row(grad + i * cols, live + i * cols, xi, r, gain, partial,
                                   out, cols, 1)
               : norm_backward_row(grad + i * cols, NULL, xi, r, gain, partial, out, cols, 0);
      const float g = sum * (r * r * r) * (-0.5f / width);
      row_grad[i] = g;
      if (finish) add_scaled_row(out, xi, 2.0f * g, cols); /* the row is still in cache */
    }
  }
}

/* grad_x[i, j] += x[i, j] * 2 row_grad[i]: the square sums' part of the gradient. */
void add_row_scaled(float *restrict grad_x, const float *restrict x,
                    const float *restrict row_grad, int64_t rows, int64_t cols,
                    int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < rows; ++i)
    add_scaled_row(grad_x + i * cols, x + i * cols, 2.0f * row_grad[i], cols);
}

/* Backward of tail_forward without the norm: grad_x = grad * live * scale. */
void masked_grad(const float *restrict grad, const uint8_t *restrict live, float scale,
                 float *restrict grad_x, int64_t rows, int64_t cols, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    const float *restrict gi = grad + i * cols;
    const uint8_t *restrict li = live + i * cols;
    float *restrict out = grad_x + i * cols;
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) out[j] = (gi[j] * (float)li[j]) * scale;
  }
}

/* How many entries ahead csr_scaled_rows asks for the rows of x it will read: a row of
 * x is a random read, so its cache lines are requested while the rows before are summed
 * (measured on the sparse 1M graph's block, 2 cores: 2.5x at width 8, 1.3x at 64 and
 * 128; 8 to 32 entries ahead are alike). */
#define PREFETCH_ENTRIES 16
/* Rows of csr_scaled_rows a thread takes at a time (degrees are skewed). */
#define ROW_BLOCK 64
/* The most columns of a row csr_scaled_rows sums at once, in registers; wider products
 * go panel by panel. */
#define PANEL 128

/* Columns [0, cols) of one row of csr_scaled_rows (cols <= PANEL): its entries
 * [from, to), their columns offset by col_lo in x, summed in a local accumulator of
 * `padded` columns: a compile-time constant at every call (cols rounded up to 8 or a
 * multiple of 16), so that the accumulator stays in registers and every entry is a few
 * whole vector operations. The accumulator starts at zero, or at o's row where
 * `accumulate`, and is stored to o, times r where `scale`. The padding columns read past
 * the row's last column, into x's next columns or row, for the rows of x whose padded
 * read stays inside x (j < safe_rows), and are dropped; the other rows read cols
 * columns. Where `unit` the column scales are all ones (the sum normalisation) and not
 * read. The rows of entries PREFETCH_ENTRIES ahead (before last_entry, with a column in
 * [col_lo, col_hi)) are requested meanwhile. Per element, the same operations in the
 * same order as one loop of cols columns. */
INLINE void scaled_row(const int32_t *restrict narrow_ids, const int64_t *restrict wide_ids,
                       const int wide, const int unit, const float *restrict col_scale,
                       const float *restrict x, int64_t ld, int64_t safe_rows,
                       float *restrict o, int64_t from, int64_t to, int64_t col_lo,
                       int64_t col_hi, int accumulate, int scale, float r,
                       int64_t last_entry, const int64_t padded, const int64_t cols) {
  float acc[PANEL] __attribute__((aligned(64)));
#pragma omp simd
  for (int64_t k = 0; k < padded; ++k) acc[k] = 0.0f;
  if (accumulate) memcpy(acc, o, cols * sizeof(float));
  for (int64_t e = from; e < to; ++e) {
    if (e + PREFETCH_ENTRIES < last_entry) {
      const int64_t ahead = wide ? wide_ids[e + PREFETCH_ENTRIES]
                                 : (int64_t)narrow_ids[e + PREFETCH_ENTRIES];
      if (ahead >= col_lo && ahead < col_hi) {
        const char *row = (const char *)(x + (ahead - col_lo) * ld);
        const char *end = row + cols * (int64_t)sizeof(float);
        for (const char *line = (const char *)((uintptr_t)row & ~(uintptr_t)63); line < end;
             line += 64)
          __builtin_prefetch(line, 0, 0);
      }
    }
    const int64_t id = wide ? wide_ids[e] : (int64_t)narrow_ids[e];
    const float c = unit ? 1.0f : col_scale[id];
    const int64_t j = id - col_lo;
    const float *restrict xj = x + j * ld;
    if (j < safe_rows) {
      if (unit) {
#pragma omp simd
        for (int64_t k = 0; k < padded; ++k) acc[k] += xj[k];
      } else {
#pragma omp simd
        for (int64_t k = 0; k < padded; ++k) acc[k] += c * xj[k];
      }
    } else {
      for (int64_t k = 0; k < cols; ++k) acc[k] += c * xj[k];
    }
  }
  if (scale) {
#pragma omp simd
    for (int64_t k = 0; k < cols; ++k) o[k] = acc[k] * r;
  } else {
    memcpy(o, acc, cols * sizeof(float));
  }
}

/* The end of row i's entries from `from` on whose columns are below col_hi (columns are
 * sorted within a row). */
INLINE int64_t window_end(const int64_t *restrict indptr, const int32_t *restrict narrow_ids,
                          const int64_t *restrict wide_ids, int wide, int64_t i,
                          int64_t from, int64_t col_hi) {
  int64_t e = from;
  while (e < indptr[i + 1] && (wide ? wide_ids[e] : (int64_t)narrow_ids[e]) < col_hi) ++e;
  return e;
}

/* Rows [lo, hi) of one panel of csr_scaled_rows, `padded`, `is_wide` and `is_unit`
 * constants: whole rows, or (with a cursor) each row's entries in the window, where a
 * row without any is only scaled where the window is the last; the last panel advances
 * the row's cursor past them (the earlier panels read it unmoved). */
#define SCALED_ROWS(padded, is_wide, is_unit)                                              \
  for (int64_t i = lo; i < hi; ++i) {                                                      \
    const int64_t from = cursor ? cursor[i - start] : indptr[i];                           \
    const int64_t to = cursor ? window_end(indptr, narrow_ids, wide_ids, (is_wide), i,     \
                                           from, col_hi)                                   \
                              : indptr[i + 1];                                             \
    float *restrict o = out + (i - start) * cols + first;                                  \
    const int scale = !(is_unit) && finish;                                                \
    if (cursor && last_panel) cursor[i - start] = to;                                      \
    if (cursor && from == to) {                                                            \
      if (scale)                                                                           \
        for (int64_t k = 0; k < panel_cols; ++k) o[k] *= row_scale[i];                    \
      continue;                                                                            \
    }                                                                                      \
    scaled_row(narrow_ids, wide_ids, (is_wide), (is_unit), col_scale, panel_x, ld,         \
               safe_rows, o, from, to, col_lo, col_hi, cursor != NULL, scale,              \
               (is_unit) ? 1.0f : row_scale[i], last_entry, padded, panel_cols);           \
  }
#define PADDED_CASE(padded, is_wide, is_unit)                                              \
  case padded:                                                                             \
    SCALED_ROWS(padded, is_wide, is_unit) break;
#define PANEL_ROWS(is_wide, is_unit)                                                       \
  switch (padded) {                                                                        \
    PADDED_CASE(8, is_wide, is_unit)                                                       \
    PADDED_CASE(16, is_wide, is_unit)                                                      \
    PADDED_CASE(32, is_wide, is_unit)                                                      \
    PADDED_CASE(48, is_wide, is_unit)                                                      \
    PADDED_CASE(64, is_wide, is_unit)                                                      \
    PADDED_CASE(80, is_wide, is_unit)                                                      \
    PADDED_CASE(96, is_wide, is_unit)                                                      \
    PADDED_CASE(112, is_wide, is_unit)                                                     \
    PADDED_CASE(128, is_wide, is_unit)                                                     \
  }

/* The rows [start, stop) of a CSR block whose entry (i, j) is r_i c_j (no value array)
 * times x (rows ld floats apart, the first cols of each read; `readable` floats from x
 * on, where the padded reads must stop):
 *   out[i - start, :] = r_i sum_{e in row i} c_{j_e} x[j_e, :]
 * indices are int32, or int64 where wide; row_scale and col_scale NULL where both are
 * all ones. Unlike the tail, no eager kernel is followed: torch's CSR product multiplies
 * r_i c_j first, so the two agree to float32 rounding. A row's sum stays in registers
 * while its neighbours' rows are read (PANEL columns at a time), and the rows
 * PREFETCH_ENTRIES entries ahead are requested meanwhile; blocks of ROW_BLOCK rows go to
 * the threads dynamically, as degrees are skewed.
 *
 * With a cursor (NULL: whole rows), x is a window of the operand, its columns
 * [col_lo, col_hi) (x's row 0 is column col_lo), and each row's entries in it, from
 * cursor[i - start] on, are added to out's row; the cursors are advanced past them, and
 * the sums scaled by r_i where `finish`. Windows given in increasing order, from zeroed
 * sums and cursors at the rows' first entries, the last with `finish`, give out the
 * bits of one call over the whole operand: every sum adds the same terms in the same
 * order. */
void csr_scaled_rows(const int64_t *restrict indptr, const void *restrict indices, int wide,
                     const float *restrict row_scale, const float *restrict col_scale,
                     const float *restrict x, int64_t ld, int64_t readable,
                     float *restrict out, int64_t start, int64_t stop, int64_t cols,
                     int64_t *restrict cursor, int64_t col_lo, int64_t col_hi, int finish,
                     int threads) {
  const int32_t *restrict narrow_ids = (const int32_t *)indices;
  const int64_t *restrict wide_ids = (const int64_t *)indices;
  const int64_t last_entry = indptr[stop];
  const int unit = col_scale == NULL;
  if (!cursor) finish = 1;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int64_t lo = start; lo < stop; lo += ROW_BLOCK) {
    const int64_t hi = lo + ROW_BLOCK < stop ? lo + ROW_BLOCK : stop;
    for (int64_t first = 0; first < cols; first += PANEL) {
      const int64_t panel_cols = cols - first < PANEL ? cols - first : PANEL;
      const int last_panel = first + panel_cols == cols;
      const int64_t padded = panel_cols <= 8 ? 8 : (panel_cols + 15) / 16 * 16;
      const float *restrict panel_x = x + first;
      /* rows j of x with j * ld + first + padded <= readable */
      const int64_t reach = readable - first - padded;
      const int64_t safe_rows = reach < 0 ? 0 : reach / ld + 1;
      if (wide) {
        if (unit) {
          PANEL_ROWS(1, 1)
        } else {
          PANEL_ROWS(1, 0)
        }
      } else if (unit) {
        PANEL_ROWS(0, 1)
      } else {
        PANEL_ROWS(0, 0)
      }
    }
  }
}

/* The rows [start, stop) of the same block times a column of ones, as csr_scaled_rows
 * computes it with x = 1 (the same sums in the same order), without reading x:
 *   out[i - start] = r_i sum_{e in row i} c_{j_e}
 * and, with the scales NULL (all ones), the rows' entry counts. */
void csr_row_sums(const int64_t *restrict indptr, const void *restrict indices, int wide,
                  const float *restrict row_scale, const float *restrict col_scale,
                  float *restrict out, int64_t start, int64_t stop, int threads) {
  const int32_t *restrict narrow_ids = (const int32_t *)indices;
  const int64_t *restrict wide_ids = (const int64_t *)indices;
  if (col_scale == NULL) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = start; i < stop; ++i) out[i - start] = (float)(indptr[i + 1] - indptr[i]);
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(dynamic, 256)
  for (int64_t i = start; i < stop; ++i) {
    float sum = 0.0f;
    for (int64_t e = indptr[i]; e < indptr[i + 1]; ++e)
      sum += col_scale[wide ? wide_ids[e] : (int64_t)narrow_ids[e]];
    out[i - start] = sum * row_scale[i];
  }
}
