/* One decoder layer for M tokens in a single call (the CPU decode path: M = 1 at decode, M = k + 1
 * consecutive tokens of one sequence when verifying k speculative drafts or prefilling a prompt chunk,
 * M sequences' next tokens in a batched decode step: each row has its own cache and position).
 *
 * At decode every op works on one vector, so the interpreter's cost per op outweighs the op itself;
 * here a layer is one parallel region: the int8 products split their weight rows over the threads
 * (each weight row is read once for all M tokens), attention splits the (token, head) pairs, and the
 * small vector steps run on one thread between barriers.
 * Semantics follow the torch layer (models/base.py DecoderLayer): pre-norm, QKV product, optional
 * per-head QK RMSNorm, RoPE from the caller's cos/sin tables, KV append, (sliding-window) grouped
 * attention, output product, optional post-norm, residual; the same for the gated FFN.
 * Batch invariance: every step computes token m exactly as a call with M = 1 at its position would
 * (per-token activation quantization, the same summation order in every dot product, attention of
 * token m over the cache up to its own position), so greedy speculative decoding matches plain decode
 * bit for bit.
 */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "qgemm_cpu.h"

enum { ACT_SILU = 0, ACT_GELU_TANH = 1 };

/* A weight matrix as unpacked for gufo_qgemm_block, and where its output rows go. */
typedef struct {
    const uint8_t *q;
    const float *scale;
    const float *offset; /* NULL when the format has none */
    float *out;
    int32_t rows, group, kind;
} gufo_part;

/* Must match DecodeLayerStruct in kernels/decode.py field for field. */
typedef struct {
    int32_t n_embd, n_heads, n_kv_heads, key_dim, value_dim, n_ff;
    int32_t rope_dim, rope_neox, act, window; /* window 0: attend to the whole cache */
    float eps, attn_scale;
    const float *attn_norm, *q_norm, *k_norm, *post_attn_norm, *ffn_norm, *post_ffn_norm; /* q/k/post: NULL = none */
    int32_t n_qkv, n_gate_up;
    gufo_part qkv[3], o, gate_up[2], down;
    /* Views into the parts' outputs (row 0); token m's row is ld_qkv / ld_gate_up floats further. */
    float *q, *k, *v, *gate, *up;
    /* Scratch, one row per token: normed input and block output [M][n_embd], attention output
     * [M][n_heads * value_dim], FFN hidden [M][n_ff]. */
    float *xn, *attn, *h, *act_out;
    int8_t *xq; /* quantized activations [M][K] of the current product, and their scales/sums */
    float *xs, *xsum16, *xsum32;
    int32_t ld_qkv, ld_gate_up;
} gufo_layer;

/* x [M][K] -> xq, scales and sums, one token per work item (each exactly as with M = 1). */
static void quantize(const gufo_layer *L, int M, int K, const float *x) {
    const int nb = K / QK;
#pragma omp for schedule(static)
    for (int m = 0; m < M; m++)
        gufo_quantize_act(1, K, x + (size_t)m * K, L->xq + (size_t)m * K, L->xs + (size_t)m * nb,
                          L->xsum16 + (size_t)m * nb * 2, L->xsum32 + (size_t)m * nb);
}

/* All parts read the same quantized input; their row blocks form one work list for the team. Token m's
 * outputs land ldy floats after token m - 1's. */
static void products(const gufo_layer *L, int M, int n, const gufo_part *parts, int K, int ldy) {
    int total = 0;
    for (int p = 0; p < n; p++) total += ROW_BLOCKS(parts[p].rows);
#pragma omp for schedule(static)
    for (int i = 0; i < total; i++) {
        int p = 0, nbk = i;
        while (nbk >= ROW_BLOCKS(parts[p].rows)) nbk -= ROW_BLOCKS(parts[p++].rows);
        const gufo_part *P = parts + p;
        gufo_qgemm_block(M, P->rows, K, P->group, P->kind, L->xq, L->xs, P->group == 16 ? L->xsum16 : L->xsum32,
                         P->q, P->scale, P->offset, P->out, ldy, nbk);
    }
}

/* x * cos + partner(x) * sin over the first `dim` columns of each head; tables laid out as Rope.tables. */
static void rope(float *x, int heads, int head_dim, int dim, int neox, const float *cos, const float *sin) {
    float tmp[dim];
    const int half = dim / 2;
    for (int h = 0; h < heads; h++) {
        float *v = x + (size_t)h * head_dim;
        for (int i = 0; i < dim; i++) {
            const float partner = neox ? v[i < half ? i + half : i - half] : v[i ^ 1];
            tmp[i] = v[i] * cos[i] + partner * sin[i];
        }
        memcpy(v, tmp, sizeof(float) * dim);
    }
}

static float dot(const float *a, const float *b, int n) {
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float sum = hsum256(acc);
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

/* out += p * v over n floats */
static void axpy(float *out, float p, const float *v, int n) {
    const __m256 pv = _mm256_set1_ps(p);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + i), _mm256_loadu_ps(out + i)));
    for (; i < n; i++) out[i] += p * v[i];
}

/* The KV pool of one layer, [kv_heads][pages][page][dim]: position t of a slot sits at offset t % page of
 * page table[t / page]. */
typedef struct {
    float *keys, *values;
    int64_t pages, page;
} kv_pool;

/* Entry (keys: key, else value) of position t, KV head g, of the slot whose page table is `table`. */
static inline float *entry(const kv_pool *P, const gufo_layer *L, const int64_t *table, int g, int t, int key) {
    const int dim = key ? L->key_dim : L->value_dim;
    const size_t row = ((size_t)g * P->pages + (size_t)table[t / P->page]) * P->page + t % P->page;
    return (key ? P->keys : P->values) + row * dim;
}

/* The last position of the page that holds position t, at most pos: positions t..that one are consecutive
 * entries of one page, so a loop over them steps a pointer instead of looking each one up. */
static inline int page_end(const kv_pool *P, int t, int pos) {
    const int end = t - (int)(t % P->page) + (int)P->page - 1;
    return end < pos ? end : pos;
}

/* Softmax attention of token m's head h over cache positions first..pos (scores: ctx floats of its own). */
static void attend(const gufo_layer *L, const kv_pool *P, int m, int h, const int64_t *table, int first, int pos,
                   float *scores) {
    const int dk = L->key_dim, dv = L->value_dim, kvh = h / (L->n_heads / L->n_kv_heads);
    const float *q = L->q + (size_t)m * L->ld_qkv + (size_t)h * dk;
    float mx = -INFINITY;
    for (int t = first; t <= pos;) {
        const float *k = entry(P, L, table, kvh, t, 1);
        for (const int end = page_end(P, t, pos); t <= end; t++, k += dk) {
            scores[t] = dot(q, k, dk) * L->attn_scale;
            mx = fmaxf(mx, scores[t]);
        }
    }
    float sum = 0.0f;
    for (int t = first; t <= pos; t++) {
        scores[t] = expf(scores[t] - mx);
        sum += scores[t];
    }
    float *out = L->attn + (size_t)m * L->n_heads * dv + (size_t)h * dv;
    memset(out, 0, sizeof(float) * dv);
    for (int t = first; t <= pos;) {
        const float *v = entry(P, L, table, kvh, t, 0);
        for (const int end = page_end(P, t, pos); t <= end; t++, v += dv) axpy(out, scores[t] / sum, v, dv);
    }
}

/* x += post_norm(h) (or h when there is no post-norm), token m's rows. */
static void residual(const gufo_layer *L, int m, float *x, const float *post_norm) {
    float *h = L->h + (size_t)m * L->n_embd;
    x += (size_t)m * L->n_embd;
    if (post_norm != NULL) gufo_rms_norm(1, L->n_embd, h, post_norm, L->eps, h);
    for (int i = 0; i < L->n_embd; i++) x[i] += h[i];
}

static void activate(const gufo_layer *L, int m) {
    const float *gate = L->gate + (size_t)m * L->ld_gate_up, *up = L->up + (size_t)m * L->ld_gate_up;
    float *out = L->act_out + (size_t)m * L->n_ff;
    for (int i = 0; i < L->n_ff; i++) {
        const float g = gate[i];
        const float a = L->act == ACT_SILU ? g / (1.0f + expf(-g))
                                           : 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
        out[i] = a * up[i];
    }
}

/* x [M][n_embd] is updated in place; token m sits at position pos[m] of the slot whose page table is
 * tables[m], in this layer's KV pool keys/values ([kv_heads][pages][page][dim]); every token's k, v are
 * written before any token attends. cos/sin: the RoPE tables of the M positions ([M][rope_dim]). The team
 * has n_threads threads, and scores holds ctx floats for each (one head's attention scores at a time). */
void gufo_decode_layer(const gufo_layer *L, int M, float *x, const float *cos, const float *sin, float *keys,
                       float *values, int64_t pages, int64_t page, const int64_t *const *tables, int ctx,
                       const int32_t *pos, float *scores, int n_threads) {
    const int n_attn = L->n_heads * L->value_dim, E = L->n_embd;
    const kv_pool pool = {keys, values, pages, page};
#pragma omp parallel num_threads(n_threads)
    {
#pragma omp single
        for (int m = 0; m < M; m++) gufo_rms_norm(1, E, x + (size_t)m * E, L->attn_norm, L->eps, L->xn + (size_t)m * E);
        quantize(L, M, E, L->xn);
        products(L, M, L->n_qkv, L->qkv, E, L->ld_qkv);
#pragma omp single
        for (int m = 0; m < M; m++) {
            float *q = L->q + (size_t)m * L->ld_qkv, *k = L->k + (size_t)m * L->ld_qkv;
            const float *v = L->v + (size_t)m * L->ld_qkv;
            const float *c = cos + (size_t)m * L->rope_dim, *s = sin + (size_t)m * L->rope_dim;
            if (L->q_norm != NULL) {
                gufo_rms_norm(L->n_heads, L->key_dim, q, L->q_norm, L->eps, q);
                gufo_rms_norm(L->n_kv_heads, L->key_dim, k, L->k_norm, L->eps, k);
            }
            rope(q, L->n_heads, L->key_dim, L->rope_dim, L->rope_neox, c, s);
            rope(k, L->n_kv_heads, L->key_dim, L->rope_dim, L->rope_neox, c, s);
            for (int g = 0; g < L->n_kv_heads; g++) {
                memcpy(entry(&pool, L, tables[m], g, pos[m], 1), k + (size_t)g * L->key_dim,
                       sizeof(float) * L->key_dim);
                memcpy(entry(&pool, L, tables[m], g, pos[m], 0), v + (size_t)g * L->value_dim,
                       sizeof(float) * L->value_dim);
            }
        }
#pragma omp for schedule(static)
        for (int i = 0; i < M * L->n_heads; i++) {
            const int m = i / L->n_heads, h = i % L->n_heads, at = pos[m];
            const int first = L->window > 0 && at - L->window + 1 > 0 ? at - L->window + 1 : 0;
            attend(L, &pool, m, h, tables[m], first, at, scores + (size_t)omp_get_thread_num() * ctx);
        }
        quantize(L, M, n_attn, L->attn);
        products(L, M, 1, &L->o, n_attn, E);
#pragma omp single
        for (int m = 0; m < M; m++) {
            residual(L, m, x, L->post_attn_norm);
            gufo_rms_norm(1, E, x + (size_t)m * E, L->ffn_norm, L->eps, L->xn + (size_t)m * E);
        }
        quantize(L, M, E, L->xn);
        products(L, M, L->n_gate_up, L->gate_up, E, L->ld_gate_up);
#pragma omp for schedule(static)
        for (int m = 0; m < M; m++) activate(L, m);
        quantize(L, M, L->n_ff, L->act_out);
        products(L, M, 1, &L->down, L->n_ff, E);
#pragma omp single
        for (int m = 0; m < M; m++) residual(L, m, x, L->post_ffn_norm);
    }
}
