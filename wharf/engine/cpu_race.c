/* The exponential race of wharf/engine/sampling.py (argmax_i p_i / E_i, E_i ~ Exp(1)) with the very
 * draws torch makes, without computing every E_i.
 *
 * torch's exponential_ on a float32 CPU tensor takes, per element, two 32-bit outputs hi, lo of
 * the generator's mt19937, u = ((hi << 32 | lo) & (2^53 - 1)) * 2^-53 and E = (float)-log1p(-u);
 * sampling then takes the first index of the largest float32 p_i / E_i (NaN counts as largest).
 * The log1p is most of that cost. Here the same u_i are drawn from the generator's state (its
 * get_state bytes, read and written back), and since u <= -log1p(-u) <= u / (1 - u), each ratio
 * lies in [p (1 - u) / u, p / u]: log1p is computed only where that upper bound reaches the best
 * lower bound (a handful of indices), so the token is torch's, bit for bit, and the generator
 * ends where torch's would. Built by wharf/engine/cpu_race.py; checked against torch at load. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MT_N 624
#define MT_M 397
/* torch.Generator.get_state() on a CPU generator (CPUGeneratorImplState): the mt19937 fields. */
#define AT_LEFT 8
#define AT_NEXT 16
#define AT_WORDS 24 /* 624 uint64, each holding a 32-bit state word */
/* Slack on the bounds for float rounding (~1.2e-7 relative in E and in the division). */
#define SLACK 1e-6

typedef struct {
  uint32_t s[MT_N];
  int32_t left;
  uint64_t next;
} mt19937;

static inline uint32_t twist(uint32_t u, uint32_t v) {
  return (((u & 0x80000000u) | (v & 0x7fffffffu)) >> 1) ^ ((v & 1u) ? 0x9908b0dfu : 0u);
}

/* torch's mt19937_engine::next_state. */
static void next_state(uint32_t *p) {
  int i = 0;
  for (; i < MT_N - MT_M; i++) p[i] = p[i + MT_M] ^ twist(p[i], p[i + 1]);
  for (; i < MT_N - 1; i++) p[i] = p[i + MT_M - MT_N] ^ twist(p[i], p[i + 1]);
  p[MT_N - 1] = p[MT_M - 1] ^ twist(p[MT_N - 1], p[0]);
}

/* n outputs, as n calls of torch's operator() would give them: a call decrements left and
 * refills the state when it reaches 0, so left - 1 words are ready after the one at next - 1. */
static void draw(mt19937 *g, uint32_t *out, size_t n) {
  for (size_t k = 0; k < n;) {
    if (g->left == 1) {
      next_state(g->s);
      g->left = MT_N + 1;
      g->next = 0;
    }
    size_t take = (size_t)(g->left - 1) < n - k ? (size_t)(g->left - 1) : n - k;
    const uint32_t *src = g->s + g->next;
    for (size_t i = 0; i < take; i++) {
      uint32_t y = src[i];
      y ^= y >> 11;
      y ^= (y << 7) & 0x9d2c5680u;
      y ^= (y << 15) & 0xefc60000u;
      y ^= y >> 18;
      out[k + i] = y;
    }
    g->next += take;
    g->left -= (int32_t)take;
    k += take;
  }
}

static int load(const uint8_t *st, mt19937 *g) {
  memcpy(&g->left, st + AT_LEFT, sizeof g->left);
  memcpy(&g->next, st + AT_NEXT, sizeof g->next);
  if (g->left < 1 || g->left > MT_N + 1 || (g->left != 1 && g->next + (uint64_t)g->left != MT_N + 1)) return -1;
  for (int j = 0; j < MT_N; j++) {
    uint64_t w;
    memcpy(&w, st + AT_WORDS + 8 * j, 8);
    g->s[j] = (uint32_t)w;
  }
  return 0;
}

static void store(const mt19937 *g, uint8_t *st) {
  memcpy(st + AT_LEFT, &g->left, sizeof g->left);
  memcpy(st + AT_NEXT, &g->next, sizeof g->next);
  for (int j = 0; j < MT_N; j++) {
    uint64_t w = g->s[j];
    memcpy(st + AT_WORDS + 8 * j, &w, 8);
  }
}

/* Bounds over one block of n indices (n % 8 == 0): the largest lower bound p (1 - u) / u into
 * low[] lane by lane, and the block's largest upper bound p / u returned (NaN if any is NaN).
 * In GCC's vector types, so it vectorizes without fast-math (AVX-512 or two AVX2 halves). */
typedef double v8d __attribute__((vector_size(64)));
typedef int64_t v8l __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));
#define BLOCK 64
static inline v8d pick(v8l take, v8d a, v8d b) { return (v8d)((take & (v8l)a) | (~take & (v8l)b)); }

static double bounds(const float *p, const double *u, int64_t n, v8d *low) {
  v8d high = {0};
  for (int64_t i = 0; i < n; i += 8) {
    v8f pf;
    v8d ud;
    memcpy(&pf, p + i, sizeof pf);
    memcpy(&ud, u + i, sizeof ud);
    v8d hi = __builtin_convertvector(pf, v8d) / ud, lo = hi * (1.0 - ud);
    high = pick((hi > high) | (hi != hi), hi, high);
    *low = pick(lo > *low, lo, *low);
  }
  double top = 0.0;
  for (int j = 0; j < 8; j++) top = (high[j] > top || high[j] != high[j]) ? high[j] : top;
  return top;
}

/* One row: the index torch's race picks. raw: 2V words, u: V doubles, top: V / BLOCK + 1 doubles
 * of scratch. */
static int64_t race(const float *p, int64_t V, mt19937 *g, uint32_t *raw, double *u, double *top) {
  draw(g, raw, 2 * (size_t)V);
  const uint64_t mask = (1ull << 53) - 1;
  for (int64_t i = 0; i < V; i++)
    u[i] = (double)((((uint64_t)raw[2 * i] << 32) | raw[2 * i + 1]) & mask) * (1.0 / 9007199254740992.0);
  v8d low = {0};
  int64_t full = V - V % BLOCK;
  for (int64_t b = 0; b < full; b += BLOCK) top[b / BLOCK] = bounds(p + b, u + b, BLOCK, &low);
  double best_low = 0.0;
  for (int j = 0; j < 8; j++) best_low = low[j] > best_low ? low[j] : best_low;
  for (int64_t i = full; i < V; i++) {
    double lo = (double)p[i] * (1.0 - u[i]) / u[i];
    best_low = lo > best_low ? lo : best_low;
  }
  top[full / BLOCK] = INFINITY; /* the tail is always looked at */
  double floor = best_low * (1.0 - SLACK);
  int64_t arg = -1;
  float best = 0.0f;
  for (int64_t b = 0; b < V; b += BLOCK) {
    if (top[b / BLOCK] < floor) continue; /* no index here can win (NaN blocks are looked at) */
    for (int64_t i = b; i < V && i < b + BLOCK; i++) {
      /* u = 0 (E = 0) and NaN p go through the exact path: torch's division makes inf or NaN. */
      if (!(u[i] == 0.0 || p[i] != p[i] || (double)p[i] >= floor * u[i])) continue;
      float e = (float)(-1.0 * log1p(-u[i]));
      float v = p[i] / e;
      if (arg < 0 || (best == best && (v != v || v > best))) {
        arg = i;
        best = v;
      }
    }
  }
  return arg;
}

/* For each of n rows (rows[r] of p [*, V], fp32, contiguous), the race's index into out[r],
 * drawn from and advancing states[r] (get_state bytes). Returns -1, changing nothing, if a
 * state is not one this code understands; -2 if out of memory. */
int wharf_race_rows(const float *p, const int64_t *rows, int64_t n, int64_t V, uint8_t **states,
                    int64_t *out, int threads) {
  mt19937 *g = malloc(sizeof(mt19937) * (size_t)(n > 0 ? n : 1));
  if (!g) return -2;
  for (int64_t r = 0; r < n; r++)
    if (load(states[r], &g[r]) != 0) {
      free(g);
      return -1;
    }
  int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
  {
    uint32_t *raw = malloc(sizeof(uint32_t) * 2 * (size_t)V);
    double *u = malloc(sizeof(double) * (size_t)V);
    double *top = malloc(sizeof(double) * (size_t)(V / BLOCK + 1));
    if (!raw || !u || !top) failed = 1;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < n; r++)
      if (raw && u && top) out[r] = race(p + rows[r] * V, V, &g[r], raw, u, top);
    free(raw);
    free(u);
    free(top);
  }
  if (!failed)
    for (int64_t r = 0; r < n; r++) store(&g[r], states[r]);
  free(g);
  return failed ? -2 : 0;
}
