/* y = x @ w.T + b for a chunk of rows of x (a decode step's, or 128 of a prefill's): fp32, each
 * weight read once from memory for the whole chunk.
 *
 * x [M, K], w [N, K] (nn.Linear's layout, row-major), b [N] or NULL, y [M, N]. Each output is a
 * dot product over K in vector lanes, summed across the lanes at the end; a tile of MB rows x NB
 * weight rows keeps MB * NB accumulators in registers, so each weight vector loaded is used MB
 * times. Weight rows are split across threads. While a block of NB weight rows is computed, the
 * block PREFETCH_AHEAD after it is requested into L2: the hardware prefetcher alone left memory
 * idle while a block's passes ran (1.2-1.3x at 4-32 rows on an Intel Xeon host). Built by
 * wharf/core/cpu_linear.py with -march=native: AVX-512 where the CPU has it, else AVX2 + FMA. */
#include <immintrin.h>
#include <stddef.h>

#define PREFETCH_AHEAD 2  /* blocks; 1 and 4 timed the same, within noise */

#if defined(__AVX512F__)
#define LANES 16
typedef __m512 vec;
#define VZERO() _mm512_setzero_ps()
#define VLOAD(p) _mm512_loadu_ps(p)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VSUM(v) _mm512_reduce_add_ps(v)
#define VSET1(a) _mm512_set1_ps(a)
#define VSTORE(p, v) _mm512_storeu_ps(p, v)
#define ISA 512
#elif defined(__AVX2__) && defined(__FMA__)
#define LANES 8
typedef __m256 vec;
#define VZERO() _mm256_setzero_ps()
#define VLOAD(p) _mm256_loadu_ps(p)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VSET1(a) _mm256_set1_ps(a)
#define VSTORE(p, v) _mm256_storeu_ps(p, v)
static inline float VSUM(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#define ISA 256
#else
#define ISA 0
#endif

int wharf_linear_isa(void) { return ISA; }

#if ISA
/* The K % LANES tail is summed in scalar after the vector sum (K is a multiple of LANES for the
 * models served here: 576, 1536). */
#define TILE(MB, NBT)                                                                              \
  static void tile_##MB##_##NBT(const float *x, const float *w, float *y, int K, int N, int m0,   \
                                int n0, const char *pf, const char *pf_end, int per) {            \
    vec acc[MB][NBT];                                                                              \
    _Pragma("GCC unroll 8") for (int i = 0; i < MB; i++)                                           \
      _Pragma("GCC unroll 8") for (int j = 0; j < NBT; j++) acc[i][j] = VZERO();                   \
    int kv = K - K % LANES;                                                                        \
    for (int k = 0; k < kv; k += LANES) {                                                          \
      vec wv[NBT];                                                                                 \
      _Pragma("GCC unroll 8") for (int j = 0; j < NBT; j++) wv[j] = VLOAD(w + (size_t)(n0 + j) * K + k); \
      for (int q = 0; q < per && pf < pf_end; q++, pf += 64) _mm_prefetch(pf, _MM_HINT_T1);         \
      _Pragma("GCC unroll 8") for (int i = 0; i < MB; i++) {                                       \
        vec xv = VLOAD(x + (size_t)(m0 + i) * K + k);                                              \
        _Pragma("GCC unroll 8") for (int j = 0; j < NBT; j++) acc[i][j] = VFMA(xv, wv[j], acc[i][j]); \
      }                                                                                            \
    }                                                                                              \
    _Pragma("GCC unroll 8") for (int i = 0; i < MB; i++)                                           \
      _Pragma("GCC unroll 8") for (int j = 0; j < NBT; j++) {                                      \
        float s = VSUM(acc[i][j]);                                                                 \
        for (int k = kv; k < K; k++) s += x[(size_t)(m0 + i) * K + k] * w[(size_t)(n0 + j) * K + k]; \
        y[(size_t)(m0 + i) * N + n0 + j] = s;                                                      \
      }                                                                                            \
  }

typedef void (*tile_fn)(const float *, const float *, float *, int, int, int, int, const char *, const char *,
                        int);
typedef void (*dxtile_fn)(const float *, const float *, float *, int, int, int, int);
/* NB weight rows a full tile: 4 x 6 accumulators fit AVX-512's 32 registers, 4 x 3 AVX2's 16. */
#if ISA == 512
#define NB 6
TILE(4, 6) TILE(3, 6) TILE(2, 6) TILE(1, 6)
static const tile_fn FULL[5] = {0, tile_1_6, tile_2_6, tile_3_6, tile_4_6};
#else
#define NB 3
TILE(4, 3) TILE(3, 3) TILE(2, 3) TILE(1, 3)
static const tile_fn FULL[5] = {0, tile_1_3, tile_2_3, tile_3_3, tile_4_3};
#endif
TILE(4, 1) TILE(3, 1) TILE(2, 1) TILE(1, 1)
static const tile_fn ONE[5] = {0, tile_1_1, tile_2_1, tile_3_1, tile_4_1};

/* One block of NB weight rows (or the last, narrower one) against every row of x, one pass a 4
 * rows of x. The block PREFETCH_AHEAD after it is one contiguous range of w: its cache lines are
 * requested `per` a vector step, spread over the passes so that memory stays busy through all. */
static void block(const float *x, const float *w, float *y, int M, int K, int N, int n0) {
  int passes = (M + 3) / 4, steps = K / LANES, lines = NB * K * 4 / 64;
  int per = steps ? (lines + passes * steps - 1) / (passes * steps) : 0;
  const char *end = (const char *)(w + (size_t)N * K);
  const char *pf = n0 + PREFETCH_AHEAD * NB < N ? (const char *)(w + (size_t)(n0 + PREFETCH_AHEAD * NB) * K) : end;
  const char *pf_end = end - pf > (ptrdiff_t)NB * K * 4 ? pf + (size_t)NB * K * 4 : end;
  for (int m0 = 0; m0 < M; m0 += 4, pf += (size_t)per * steps * 64) {
    int mb = M - m0 < 4 ? M - m0 : 4;
    if (n0 + NB <= N)
      FULL[mb](x, w, y, K, N, m0, n0, pf, pf_end, per);
    else
      for (int n = n0; n < N; n++) ONE[mb](x, w, y, K, N, m0, n, end, end, 0);
  }
}

void wharf_linear(const float *x, const float *w, const float *b, float *y, int M, int K, int N,
                  int threads) {
  int blocks = (N + NB - 1) / NB;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int i = 0; i < blocks; i++) block(x, w, y, M, K, N, i * NB);
  if (b)
    for (int m = 0; m < M; m++)
      for (int n = 0; n < N; n++) y[(size_t)m * N + n] += b[n];
}

/* dx = dy @ w, the input gradient of y = x @ w.T when w is frozen (LoRA's base weights): dy [M, N],
 * w [N, K], dx [M, K]. A tile of MB rows x KB vectors of dx stays in registers while the rows of
 * w stream past, each w vector serving MB rows; blocks of columns are split across threads. */
#define DXTILE(MB, KB)                                                                             \
  static void dxtile_##MB##_##KB(const float *dy, const float *w, float *dx, int N, int K, int m0, \
                                 int k0) {                                                         \
    vec acc[MB][KB];                                                                               \
    _Pragma("GCC unroll 8") for (int i = 0; i < MB; i++)                                           \
      _Pragma("GCC unroll 8") for (int j = 0; j < KB; j++) acc[i][j] = VZERO();                    \
    for (int n = 0; n < N; n++) {                                                                  \
      vec wv[KB];                                                                                  \
      _Pragma("GCC unroll 8") for (int j = 0; j < KB; j++) wv[j] = VLOAD(w + (size_t)n * K + k0 + j * LANES); \
      _Pragma("GCC unroll 8") for (int i = 0; i < MB; i++) {                                       \
        vec d = VSET1(dy[(size_t)(m0 + i) * N + n]);                                               \
        _Pragma("GCC unroll 8") for (int j = 0; j < KB; j++) acc[i][j] = VFMA(d, wv[j], acc[i][j]); \
      }                                                                                            \
    }                                                                                              \
    _Pragma("GCC unroll 8") for (int i = 0; i < MB; i++)                                           \
      _Pragma("GCC unroll 8") for (int j = 0; j < KB; j++)                                         \
        VSTORE(dx + (size_t)(m0 + i) * K + k0 + j * LANES, acc[i][j]);                             \
  }

#if ISA == 512
DXTILE(4, 6) DXTILE(3, 6) DXTILE(2, 6) DXTILE(1, 6)
static const dxtile_fn DXFULL[5] = {0, dxtile_1_6, dxtile_2_6, dxtile_3_6, dxtile_4_6};
#else
DXTILE(4, 3) DXTILE(3, 3) DXTILE(2, 3) DXTILE(1, 3)
static const dxtile_fn DXFULL[5] = {0, dxtile_1_3, dxtile_2_3, dxtile_3_3, dxtile_4_3};
#endif
DXTILE(4, 1) DXTILE(3, 1) DXTILE(2, 1) DXTILE(1, 1)
static const dxtile_fn DXONE[5] = {0, dxtile_1_1, dxtile_2_1, dxtile_3_1, dxtile_4_1};

/* The columns [k0, k0 + NB * LANES) of dx (fewer in the last block: single vectors, then the
 * K % LANES tail in scalar). */
static void dxblock(const float *dy, const float *w, float *dx, int M, int N, int K, int k0) {
  int width = K - k0 < NB * LANES ? K - k0 : NB * LANES, kv = k0 + width - width % LANES;
  for (int m0 = 0; m0 < M; m0 += 4) {
    int mb = M - m0 < 4 ? M - m0 : 4;
    if (width == NB * LANES)
      DXFULL[mb](dy, w, dx, N, K, m0, k0);
    else
      for (int k = k0; k < kv; k += LANES) DXONE[mb](dy, w, dx, N, K, m0, k);
    for (int m = m0; m < m0 + mb; m++)
      for (int k = kv; k < k0 + width; k++) {
        float s = 0.0f;
        for (int n = 0; n < N; n++) s += dy[(size_t)m * N + n] * w[(size_t)n * K + k];
        dx[(size_t)m * K + k] = s;
      }
  }
}

void wharf_linear_dx(const float *dy, const float *w, float *dx, int M, int N, int K, int threads) {
  int blocks = (K + NB * LANES - 1) / (NB * LANES);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int i = 0; i < blocks; i++) dxblock(dy, w, dx, M, N, K, i * NB * LANES);
}
#endif
