/* Shared by the CPU kernels: the int8 product pieces that the fused decode layer reuses. */
#ifndef GUFO_QGEMM_CPU_H
#define GUFO_QGEMM_CPU_H

#include <immintrin.h>
#include <stdint.h>

#define QK 32
#define ROW_BLOCK 16 /* weight rows per unit of thread work */
#define ROW_BLOCKS(N) (((N) + ROW_BLOCK - 1) / ROW_BLOCK)

static inline float hsum256(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

void gufo_quantize_act(int M, int K, const float *x, int8_t *xq, float *xs, float *xsum16, float *xsum32);
void gufo_qgemm_block(int M, int N, int K, int group, int kind, const int8_t *xq, const float *xs,
                      const float *xsum, const uint8_t *w, const float *ws, const float *woff, float *y, int ldy,
                      int nbk);
void gufo_rms_norm(int M, int K, const float *x, const float *w, float eps, float *y);

#endif
