/* A Llama decoder layer's work around attention and the MLP's activation, for a decode step (one
 * new token a row), fp32: the engine's decode step otherwise runs ~210 torch operators a layer
 * (~6,500 a step for SmolLM2-135M), and at a few rows their dispatch costs about as much as
 * reading the weights. wharf/engine/cpu_layer.py calls, for each layer:
 *
 *   wharf_layer_qkv   x = norm1(h); q, k, v = x Wq^T, x Wk^T, x Wv^T; rotary on q and k;
 *                     k and v written at column `col` of the layer's KV buffers
 *   (torch)           a = attention(q, K, V) with the batch's mask, as transformers runs it
 *   wharf_layer_mlp   h += a Wo^T; x = norm2(h); g, u = x Wg^T, x Wu^T
 *   (torch)           g = silu(g) * u
 *   wharf_layer_down  h += g Wd^T
 *
 * h [M, HID] is the residual stream, updated in place. kbuf, vbuf [B, NKV, cap, D] (B = M) are a
 * kv.SlackLayer's buffers. cos, sin [M, D] are the rotary tables at each row's position, the
 * model's own (computed by torch once a step). The linear layers go through wharf_linear
 * (wharf/core/cpu_linear.c, linked into the same library). */
#include <math.h>
#include <stddef.h>

void wharf_linear(const float *x, const float *w, const float *b, float *y, int M, int K, int N, int threads);

/* y = w * (x / sqrt(mean(x^2) + eps)) for each of M rows of n, as LlamaRMSNorm. */
static void rms_norm(const float *x, const float *w, float *y, int M, int n, float eps) {
  for (int m = 0; m < M; m++) {
    const float *xr = x + (size_t)m * n;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int i = 0; i < n; i++) ss += xr[i] * xr[i];
    float r = 1.0f / sqrtf(ss / n + eps);
    for (int i = 0; i < n; i++) y[(size_t)m * n + i] = w[i] * (xr[i] * r);
  }
}

/* x (heads of D, in place) as transformers' apply_rotary_pos_emb: x * cos + rotate_half(x) * sin. */
static void rotate(float *x, const float *cos, const float *sin, int heads, int D) {
  int half = D / 2;
  for (int h = 0; h < heads; h++) {
    float *v = x + (size_t)h * D;
    for (int d = 0; d < half; d++) {
      float a = v[d], b = v[d + half];
      v[d] = a * cos[d] - b * sin[d];
      v[d + half] = b * cos[d + half] + a * sin[d + half];
    }
  }
}

static void add(float *h, const float *y, size_t n) {
  for (size_t i = 0; i < n; i++) h[i] += y[i];
}

/* x, k, v: scratch [M, HID], [M, NKV * D], [M, NKV * D]; q [M, NH * D] out. */
void wharf_layer_qkv(const float *h, const float *ln1, const float *wq, const float *wk, const float *wv,
                     const float *cos, const float *sin, float *kbuf, float *vbuf, float *q, float *x, float *k,
                     float *v, int M, int HID, int NH, int NKV, int D, int cap, int col, float eps, int threads) {
  int QD = NH * D, KD = NKV * D;
  rms_norm(h, ln1, x, M, HID, eps);
  wharf_linear(x, wq, NULL, q, M, HID, QD, threads);
  wharf_linear(x, wk, NULL, k, M, HID, KD, threads);
  wharf_linear(x, wv, NULL, v, M, HID, KD, threads);
  for (int m = 0; m < M; m++) {
    rotate(q + (size_t)m * QD, cos + (size_t)m * D, sin + (size_t)m * D, NH, D);
    rotate(k + (size_t)m * KD, cos + (size_t)m * D, sin + (size_t)m * D, NKV, D);
    for (int g = 0; g < NKV; g++) {
      size_t at = (((size_t)m * NKV + g) * cap + col) * D, from = (size_t)m * KD + (size_t)g * D;
      for (int d = 0; d < D; d++) {
        kbuf[at + d] = k[from + d];
        vbuf[at + d] = v[from + d];
      }
    }
  }
}

/* a [M, QD] attention out; x, y scratch [M, HID]; g, u [M, I] out. */
void wharf_layer_mlp(float *h, const float *a, const float *wo, const float *ln2, const float *wg,
                     const float *wu, float *g, float *u, float *x, float *y, int M, int HID, int QD, int I,
                     float eps, int threads) {
  wharf_linear(a, wo, NULL, y, M, QD, HID, threads);
  add(h, y, (size_t)M * HID);
  rms_norm(h, ln2, x, M, HID, eps);
  wharf_linear(x, wg, NULL, g, M, HID, I, threads);
  wharf_linear(x, wu, NULL, u, M, HID, I, threads);
}

/* g [M, I] the activation; y scratch [M, HID]. */
void wharf_layer_down(float *h, const float *g, const float *wd, float *y, int M, int HID, int I, int threads) {
  wharf_linear(g, wd, NULL, y, M, I, HID, threads);
  add(h, y, (size_t)M * HID);
}
