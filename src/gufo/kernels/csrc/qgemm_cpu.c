/* Quantized matrix products for the CPU backend (AVX2 + FMA).
 *
 * Weights are GGUF blocks unpacked once at load into 8-bit integers with one float scale per group
 * of G = 16 or 32 columns and an optional float offset per group (w = q * scale + offset).
 * Activations are quantized per 32 columns to int8 (x ~ xq * xs), as llama.cpp does, so a dot product
 * is an integer dot per block times two scales, plus offset * (sum of the block's activations).
 *
 * Unsigned weights (q + shift fits 0..127, formats of at most 7 bits) feed _mm256_maddubs_epi16
 * directly; the shift is folded into the offsets at load. Values that fit 0..15 are stored two per
 * byte (byte i of a 32-column block holds column i in its low nibble and column i + 16 in its high
 * nibble), halving the bytes decode has to stream. Signed 8-bit weights (Q8_0) use the abs/sign trick
 * so the int16 pair sums cannot saturate.
 */
#include <math.h>
#include <stdlib.h>

#include "qgemm_cpu.h"

/* x [M][K] float -> xq [M][K] int8, xs [M][K/32] scales, xsum16 [M][K/16] and xsum32 [M][K/32]
 * sums of the dequantized (xq * xs) values. */
void gufo_quantize_act(int M, int K, const float *x, int8_t *xq, float *xs, float *xsum16, float *xsum32) {
    const int nb = K / QK;
#pragma omp parallel for schedule(static) if (M > 4)
    for (int m = 0; m < M; m++) {
        for (int b = 0; b < nb; b++) {
            const float *src = x + (size_t)m * K + b * QK;
            int8_t *dst = xq + (size_t)m * K + b * QK;
            float amax = 0.0f;
            for (int i = 0; i < QK; i++) amax = fmaxf(amax, fabsf(src[i]));
            const float d = amax / 127.0f;
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            int s0 = 0, s1 = 0;
            for (int i = 0; i < QK; i++) {
                int q = (int)nearbyintf(src[i] * id);
                dst[i] = (int8_t)q;
                if (i < 16) s0 += q; else s1 += q;
            }
            xs[(size_t)m * nb + b] = d;
            xsum16[(size_t)m * nb * 2 + 2 * b] = d * (float)s0;
            xsum16[(size_t)m * nb * 2 + 2 * b + 1] = d * (float)s1;
            xsum32[(size_t)m * nb + b] = d * (float)(s0 + s1);
        }
    }
}

static inline __m256i load_w8(const uint8_t *row, int b) {
    return _mm256_loadu_si256((const __m256i *)(row + (size_t)b * QK));
}

static inline __m256i load_w4(const uint8_t *row, int b) {
    const __m128i packed = _mm_loadu_si128((const __m128i *)(row + (size_t)b * (QK / 2)));
    const __m128i low = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(packed, low), hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low);
    return _mm256_insertf128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

static inline __m256i dot_u8s8(__m256i w, __m256i x, __m256i ones) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones);
}

static inline __m256i dot_s8s8(__m256i w, __m256i x, __m256i ones) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)), ones);
}

/* Per-block weight scale vector: 8 int32 lanes hold pair sums of columns [4l, 4l+4); lanes 0-3 cover
 * the first 16 columns, lanes 4-7 the next 16. */
static inline __m256 weight_scale(const float *ws, int b, int group) {
    if (group == 32) return _mm256_set1_ps(ws[b]);
    return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(ws[2 * b])), _mm_set1_ps(ws[2 * b + 1]), 1);
}

#define TILE_FN(NAME, RM, RN, DOT, LOAD, ROW_BYTES, PF)                                                   \
    static inline void NAME(int K, int group, const int8_t *xq, const float *xs, const uint8_t *w,        \
                            const float *ws, int ldy, float *y, int m0, int n0) {                         \
        const int nb = K / QK, ng = K / group;                                                            \
        const size_t row_bytes = (size_t)(ROW_BYTES);                                                     \
        const __m256i ones = _mm256_set1_epi16(1);                                                        \
        __m256 acc[RM][RN];                                                                               \
        for (int i = 0; i < RM; i++)                                                                      \
            for (int j = 0; j < RN; j++) acc[i][j] = _mm256_setzero_ps();                                 \
        for (int b = 0; b < nb; b++) {                                                                    \
            __m256i wv[RN];                                                                               \
            __m256 sv[RN];                                                                                \
            for (int j = 0; j < RN; j++) {                                                                \
                wv[j] = LOAD(w + (size_t)(n0 + j) * row_bytes, b);                                        \
                if (PF)                                                                                   \
                    _mm_prefetch((const char *)w + (n0 + j + PF) * row_bytes + b * (row_bytes / nb),      \
                                 _MM_HINT_T0);                                                            \
                sv[j] = weight_scale(ws + (size_t)(n0 + j) * ng, b, group);                               \
            }                                                                                             \
            for (int i = 0; i < RM; i++) {                                                                \
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + (size_t)(m0 + i) * K + b * QK)); \
                const __m256 xsv = _mm256_set1_ps(xs[(size_t)(m0 + i) * nb + b]);                         \
                for (int j = 0; j < RN; j++) {                                                            \
                    const __m256 p = _mm256_cvtepi32_ps(DOT(wv[j], xv, ones));                            \
                    acc[i][j] = _mm256_fmadd_ps(p, _mm256_mul_ps(sv[j], xsv), acc[i][j]);                 \
                }                                                                                         \
            }                                                                                             \
        }                                                                                                 \
        for (int i = 0; i < RM; i++)                                                                      \
            for (int j = 0; j < RN; j++) y[(size_t)(m0 + i) * ldy + n0 + j] = hsum256(acc[i][j]);         \
    }

/* Rows this far ahead are prefetched by the one-row tiles: decode streams weights from memory, and the
 * interleaved rows of a tile defeat the hardware prefetchers (docs/decisions.md, "CPU: prefetch 16 rows ahead in one-row tiles"). */
#define M1_PREFETCH_ROWS 16

TILE_FN(tile_u_4x2, 4, 2, dot_u8s8, load_w8, K, 0)
TILE_FN(tile_u_1x4, 1, 4, dot_u8s8, load_w8, K, M1_PREFETCH_ROWS)
TILE_FN(tile_u_1x1, 1, 1, dot_u8s8, load_w8, K, 0)
TILE_FN(tile_s_4x2, 4, 2, dot_s8s8, load_w8, K, 0)
TILE_FN(tile_s_1x4, 1, 4, dot_s8s8, load_w8, K, M1_PREFETCH_ROWS)
TILE_FN(tile_s_1x1, 1, 1, dot_s8s8, load_w8, K, 0)
TILE_FN(tile_n_4x2, 4, 2, dot_u8s8, load_w4, K / 2, 0)
TILE_FN(tile_n_1x4, 1, 4, dot_u8s8, load_w4, K / 2, M1_PREFETCH_ROWS)
TILE_FN(tile_n_1x1, 1, 1, dot_u8s8, load_w4, K / 2, 0)

enum { W_UNSIGNED8 = 0, W_SIGNED8 = 1, W_NIBBLES = 2 };

#define DISPATCH(KIND, SHAPE, ...)                                                                        \
    do {                                                                                                  \
        if ((KIND) == W_SIGNED8) tile_s_##SHAPE(__VA_ARGS__);                                             \
        else if ((KIND) == W_NIBBLES) tile_n_##SHAPE(__VA_ARGS__);                                        \
        else tile_u_##SHAPE(__VA_ARGS__);                                                                 \
    } while (0)

/* Rows [ROW_BLOCK * nbk, ROW_BLOCK * (nbk + 1)) of y [M][N] = x [M][K] @ W[N][K]^T, with W = q * ws (+ woff)
 * and x quantized by gufo_quantize_act; row m of y starts at y + m * ldy. kind: W_UNSIGNED8, W_SIGNED8 or
 * W_NIBBLES. xsum is xsum16 when group == 16, else xsum32. woff may be NULL.
 * Every tile shape accumulates an output element in the same order (blocks in sequence, one FMA each,
 * then hsum256), so row m's result does not depend on M: speculative verification relies on that. */
void gufo_qgemm_block(int M, int N, int K, int group, int kind, const int8_t *xq, const float *xs,
                      const float *xsum, const uint8_t *w, const float *ws, const float *woff, float *y, int ldy,
                      int nbk) {
    const int ng = K / group;
    const int n_start = nbk * ROW_BLOCK;
    const int n_end = n_start + ROW_BLOCK < N ? n_start + ROW_BLOCK : N;
    int m0 = 0;
    for (; m0 + 4 <= M; m0 += 4) {
        int n0 = n_start;
        for (; n0 + 2 <= n_end; n0 += 2) {
            DISPATCH(kind, 4x2, K, group, xq, xs, w, ws, ldy, y, m0, n0);
        }
        for (; n0 < n_end; n0++)
            for (int i = 0; i < 4; i++) DISPATCH(kind, 1x1, K, group, xq, xs, w, ws, ldy, y, m0 + i, n0);
    }
    for (; m0 < M; m0++) {
        int n0 = n_start;
        for (; n0 + 4 <= n_end; n0 += 4) {
            DISPATCH(kind, 1x4, K, group, xq, xs, w, ws, ldy, y, m0, n0);
        }
        for (; n0 < n_end; n0++) {
            DISPATCH(kind, 1x1, K, group, xq, xs, w, ws, ldy, y, m0, n0);
        }
    }
    if (woff != NULL) {
        for (int m = 0; m < M; m++)
            for (int n = n_start; n < n_end; n++) {
                const float *o = woff + (size_t)n * ng, *s = xsum + (size_t)m * ng;
                __m256 vacc = _mm256_setzero_ps();
                int g = 0;
                for (; g + 8 <= ng; g += 8)
                    vacc = _mm256_fmadd_ps(_mm256_loadu_ps(o + g), _mm256_loadu_ps(s + g), vacc);
                float acc = hsum256(vacc);
                for (; g < ng; g++) acc += o[g] * s[g];
                y[(size_t)m * ldy + n] += acc;
            }
    }
}

/* The whole product; threads split the weight rows, so decode (M == 1) streams with every core. */
void gufo_qgemm(int M, int N, int K, int group, int kind, const int8_t *xq, const float *xs,
                const float *xsum, const uint8_t *w, const float *ws, const float *woff, float *y) {
#pragma omp parallel for schedule(static)
    for (int nbk = 0; nbk < ROW_BLOCKS(N); nbk++)
        gufo_qgemm_block(M, N, K, group, kind, xq, xs, xsum, w, ws, woff, y, N, nbk);
}

/* One call per linear layer: quantize x [M][K] into a scratch buffer, then y = x @ W^T. Saves the
 * interpreter a round trip per product, which matters at decode (about a hundred products a token). */
int gufo_linear(int M, int N, int K, int group, int kind, const float *x, const uint8_t *w, const float *ws,
                const float *woff, float *y) {
    const size_t nb = (size_t)K / QK;
    const size_t floats = (size_t)M * nb * 4;
    void *scratch = malloc((size_t)M * K + floats * sizeof(float));
    if (scratch == NULL) return 1;
    float *xs = (float *)scratch, *xsum32 = xs + (size_t)M * nb, *xsum16 = xsum32 + (size_t)M * nb;
    int8_t *xq = (int8_t *)(xsum16 + (size_t)M * nb * 2);
    gufo_quantize_act(M, K, x, xq, xs, xsum16, xsum32);
    gufo_qgemm(M, N, K, group, kind, xq, xs, group == 16 ? xsum16 : xsum32, w, ws, woff, y);
    free(scratch);
    return 0;
}

/* y [M][K] = x / sqrt(mean(x^2) + eps) * w, rows independent (also used per attention head). */
void gufo_rms_norm(int M, int K, const float *x, const float *w, float eps, float *y) {
    for (int m = 0; m < M; m++) {
        const float *src = x + (size_t)m * K;
        float *dst = y + (size_t)m * K;
        __m256 acc = _mm256_setzero_ps();
        int k = 0;
        for (; k + 8 <= K; k += 8) {
            const __m256 v = _mm256_loadu_ps(src + k);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        float sum = hsum256(acc);
        for (; k < K; k++) sum += src[k] * src[k];
        const float inv = 1.0f / sqrtf(sum / (float)K + eps);
        const __m256 scale = _mm256_set1_ps(inv);
        for (k = 0; k + 8 <= K; k += 8)
            _mm256_storeu_ps(dst + k, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(src + k), scale),
                                                    _mm256_loadu_ps(w + k)));
        for (; k < K; k++) dst[k] = src[k] * inv * w[k];
    }
}
