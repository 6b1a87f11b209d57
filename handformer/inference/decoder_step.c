/* One decoding step of a prepared decoder-only model at batch 1, in C (handformer/inference/fused_step.py
 * builds it with gcc and calls it through ctypes): the same computation as CausalLM.forward over one
 * token, without the ~900 PyTorch operator calls and the Python around them. Two kinds of block:
 *   Llama-style: RMSNorm, fused Q/K/V, half-split RoPE, grouped-query attention, SwiGLU (fused gate/up);
 *   GPT-2-style: LayerNorm with a bias, learned positions (added to the embedding by the caller),
 *                biases on every projection, a plain feed-forward with GELU.
 * Weights are the model's own tensors (contiguous), handed over as pointers. Each product is a list
 * of Parts whose outputs follow one another (q, k and v, or one fused Q/K/V matrix; fused_step.py
 * hands a fused matrix over as its q, k and v rows, or its gate and up rows, where the layout allows),
 * each of a kind:
 *   PLAIN:   fp32 row-major (N, K) (small models, read by plain loops);
 *   BLOCKED: fp32 in c_kernels.block_rows' layout (PackedLinear's one-row copy: four rows interleaved
 *            16 numbers at a time, AVX-512 FMAs);
 *   INT8, INT4: Int8Linear's weights as its VNNI kernel reads them (c_kernels.block_int8's layout:
 *            four rows interleaved 64 bytes at a time) and Int4Linear's stored nibbles, dotted by
 *            vnni_matvec.c's own one-row functions, which the caller hands over as pointers (Vnni):
 *            the activation row is quantized once for all the Parts that read it, and each output is
 *            the machine code the layers run eagerly, so the numbers are theirs.
 * The step runs as one team of s->threads OpenMP threads (decoder_step, at the end); each Part's outputs
 * split among them, one contiguous share each. The new key and value are written into the model's KV
 * cache buffers, (1, Hkv, slots, Dh) each, at column `pos`.
 * A step may feed s->rows tokens at once (up to MAX_ROWS, at positions pos .. pos + rows - 1, each
 * attending to the positions up to its own): speculative decoding's check of its guesses. A BLOCKED
 * weight is then read from memory once for all the rows (dot4_rows: each block dotted with every row
 * while it sits in the caches), so a step of five rows costs far less than five one-row steps
 * (docs/benchmarks.md, "Speculative decoding"); each row's sums run in the order of the
 * one-row step's, so its logits are those of one-row steps fed the same tokens, bit for bit. PLAIN,
 * INT8 and INT4 Parts are dotted row by row by their one-row code. */
#include <math.h>
#include <omp.h>
#include <stdint.h>

#include "dot4.h"

enum { PLAIN = 0, BLOCKED = 1, INT8 = 2, INT4 = 3 };

typedef struct {
    int64_t n_layers, D, H, Hkv, Dh, F, V, slots, pos;
    float eps;
    int32_t layer_norm;  /* 1: LayerNorm (weight and bias); 0: RMSNorm (weight) */
    int32_t activation;  /* 0: SwiGLU over a fused gate/up of 2F rows; 1: GELU (tanh); 2: GELU (erf) */
    int32_t rope;        /* 1: half-split RoPE over each query and key head */
    int32_t threads;     /* OpenMP threads for the step */
    int32_t split_heads; /* 1: Q, K and V three Parts whose rows split by key/value head (Dh a multiple of 4) */
    int32_t rows;        /* tokens fed (1 .. MAX_ROWS), at positions pos .. pos + rows - 1 */
} Shape;

/* rows a step feeds at most; rows dot4_rows dots a block with at once; numbers its prefetches run ahead */
enum { MAX_ROWS = 8, GROUP = 6, PREFETCH = 1024 };

typedef struct {       /* a weight matrix, or the rows of one of a product's stacked outputs */
    const void *w;     /* PLAIN (N, K) fp32; BLOCKED block_rows' layout; INT8 block_int8's; INT4 (N, K/2) nibbles */
    const void *scale; /* INT8 (N,) fp32; INT4 (N, K/32) float16; else NULL */
    const float *bias; /* (N,) or NULL */
    int64_t rows;      /* N; 0: an unused slot */
    int32_t kind;
} Part;

typedef struct {  /* one block; a norm bias may be NULL (RMSNorm) */
    const float *attn_norm, *attn_norm_bias, *ffn_norm, *ffn_norm_bias;
    Part qkv[3], o, up[2], down;  /* q, k, v or one fused Q/K/V; gate, up or one fused gate/up or GELU's up */
    float *keys, *values;
} Layer;

typedef struct {  /* vnni_matvec.c's one-row functions (NULL where no Part is INT8 or INT4) */
    void (*prepare)(const float *x, int64_t K, int bits, uint8_t *out);
    void (*int8_rows)(const uint8_t *row, const void *q, const void *scale, const float *bias, float *y,
                      int64_t n0, int64_t n1, int64_t K);
    void (*int4_rows)(const uint8_t *row, const void *q, const void *scale, const float *bias, float *y,
                      int64_t n0, int64_t n1, int64_t K);
    uint8_t *row8, *row4;  /* thread 0's quantized rows, vnni_row_bytes(max(D, F), bits) bytes each, 64-byte aligned */
    int64_t stride;        /* bytes from one thread's row8 (row4) to the next thread's */
} Vnni;

typedef struct {  /* what one thread of the step holds: its place in the team and its own buffers */
    int t, T;
    Vnni v;          /* its quantized rows */
    float *xn;       /* (rows, D) the normed rows it reads */
    float *scores;   /* (slots) one head's attention weights */
    const float *quantized[2];  /* the row v.row8 / v.row4 hold, quantized in this product; NULL: none */
} Thread;

static void norm_row(float *out, const float *x, const float *w, const float *b, const Shape *s) {
    int64_t n = s->D;
    float mean = 0.0f, ss = 0.0f;
    if (s->layer_norm) {
        for (int64_t i = 0; i < n; i++) mean += x[i];
        mean /= (float)n;
    }
    for (int64_t i = 0; i < n; i++) ss += (x[i] - mean) * (x[i] - mean);
    float r = 1.0f / sqrtf(ss / (float)n + s->eps);
    for (int64_t i = 0; i < n; i++) out[i] = w[i] * ((x[i] - mean) * r) + (b ? b[i] : 0.0f);
}

static void norm(float *out, const float *x, const float *w, const float *b, const Shape *s) {  /* each row */
    for (int64_t m = 0; m < s->rows; m++) norm_row(out + m * s->D, x + m * s->D, w, b, s);
}

/* One row of a PLAIN weight dotted with x: one function (never inlined), so that a row's sum is
 * vectorized alike wherever it is called. */
__attribute__((noinline)) static float plain_dot(const float *row, const float *x, int64_t K) {
    float sum = 0.0f;
    for (int64_t k = 0; k < K; k++) sum += row[k] * x[k];
    return sum;
}

/* One block of block_rows' layout dotted with R rows of x (x + r * xs), each row's four sums in dot4's
 * order (the same FMA chains), into out[r][0..3]. R a constant after inlining: the 4 R accumulators,
 * the block's four vectors and one of x stay in registers (R <= 6: 29 of AVX-512's 32). Each vector of
 * x is loaded once, not folded into its four FMAs (the empty asm), and the weights are prefetched
 * PREFETCH numbers ahead: with 4 R FMAs a vector of weights the loop is slow enough to issue its loads
 * late, and the prefetches keep the memory busy meanwhile. */
static inline __attribute__((always_inline)) void dot4_rows(const float *x, int64_t xs, const float *w,
                                                            int64_t K, int R, float out[GROUP][4]) {
    __m512 a[GROUP][4];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < 4; j++) a[r][j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16, w += 64) {
        for (int j = 0; j < 4; j++) _mm_prefetch((const char *)(w + PREFETCH + 16 * j), _MM_HINT_T0);
        __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16), w2 = _mm512_loadu_ps(w + 32),
               w3 = _mm512_loadu_ps(w + 48);
        for (int r = 0; r < R; r++) {
            __m512 xk = _mm512_loadu_ps(x + r * xs + k);
            __asm__("" : "+v"(xk));
            a[r][0] = _mm512_fmadd_ps(w0, xk, a[r][0]);
            a[r][1] = _mm512_fmadd_ps(w1, xk, a[r][1]);
            a[r][2] = _mm512_fmadd_ps(w2, xk, a[r][2]);
            a[r][3] = _mm512_fmadd_ps(w3, xk, a[r][3]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int j = 0; j < 4; j++) out[r][j] = _mm512_reduce_add_ps(a[r][j]);
}

/* Block i of a BLOCKED Part dotted with the M rows of x (row stride xs), in groups of at most GROUP
 * rows as even as can be (the block read from memory once, then from the caches), outputs n < n1 of each row
 * into y (row stride ys). */
static void blocked_rows(float *y, int64_t ys, const Part *p, const float *x, int64_t xs, int64_t K, int64_t M,
                         int64_t i, int64_t n1) {
    const float *w = (const float *)p->w + i * 4 * K;
    float out[GROUP][4];
    int64_t groups = (M + GROUP - 1) / GROUP;
    for (int64_t g = 0, r0 = 0; g < groups; g++) {
        int64_t R = M * (g + 1) / groups - r0;
        const float *xr = x + r0 * xs;
        switch (R) {
            case 1: dot4(xr, w, K, out[0]); break;
            case 2: dot4_rows(xr, xs, w, K, 2, out); break;
            case 3: dot4_rows(xr, xs, w, K, 3, out); break;
            case 4: dot4_rows(xr, xs, w, K, 4, out); break;
            case 5: dot4_rows(xr, xs, w, K, 5, out); break;
            default: dot4_rows(xr, xs, w, K, 6, out);
        }
        for (int64_t r = 0; r < R; r++)
            for (int64_t n = i * 4; n < n1 && n < p->rows && n < i * 4 + 4; n++)
                y[(r0 + r) * ys + n] = out[r][n - i * 4] + (p->bias ? p->bias[n] : 0.0f);
        r0 += R;
    }
}

/* x (K) quantized into the thread's own row for Parts of `kind` (INT8 or INT4), unless that row holds
 * it already (quantized in this product). */
static void quantize(Thread *th, int32_t kind, const float *x, int64_t K) {
    if (th->quantized[kind - INT8] == x)
        return;
    th->v.prepare(x, K, kind == INT8 ? 8 : 4, kind == INT8 ? th->v.row8 : th->v.row4);
    th->quantized[kind - INT8] = x;
}

/* The outputs n0 <= n < n1 of one Part for each of the M rows of x (K numbers each, row stride xs):
 * y[m * ys + n] = W x[m] + b (n0 a multiple of 4 for BLOCKED and INT8). */
static void part_rows(float *y, int64_t ys, const Part *p, const float *x, int64_t xs, int64_t K, int64_t M,
                      int64_t n0, int64_t n1, Thread *th) {
    const float *b = p->bias;
    if (n0 >= n1)
        return;
    if (p->kind == BLOCKED) {  /* blocks of four rows, K a multiple of 16 */
        for (int64_t i = n0 / 4; i < (n1 + 3) / 4; i++) blocked_rows(y, ys, p, x, xs, K, M, i, n1);
        return;
    }
    for (int64_t m = 0; m < M; m++) {
        const float *xm = x + m * xs;
        float *ym = y + m * ys;
        if (p->kind == INT8) {  /* blocks of four rows (c_kernels.block_int8's layout) */
            quantize(th, INT8, xm, K);
            th->v.int8_rows(th->v.row8, p->w, p->scale, b, ym, n0, n1, K);
        } else if (p->kind == INT4) {
            quantize(th, INT4, xm, K);
            th->v.int4_rows(th->v.row4, p->w, p->scale, b, ym, n0, n1, K);
        } else {
            for (int64_t n = n0; n < n1; n++) ym[n] = plain_dot((const float *)p->w + n * K, xm, K) + (b ? b[n] : 0.0f);
        }
    }
}

/* Thread t's share (of T) of a Part's outputs: whole chunks of 16 rows (four blocks of four for
 * BLOCKED and INT8). A share starts at a multiple of 16 whatever T is, so the loops over a share's
 * outputs (the activation) split into vectors of 16 and a scalar tail alike for any thread count:
 * the logits do not depend on it. */
static void share(const Part *p, int t, int T, int64_t *n0, int64_t *n1) {
    int64_t N = p->rows, chunks = (N + 15) / 16, end = chunks * (t + 1) / T * 16;
    *n0 = chunks * t / T * 16;
    *n1 = end < N ? end : N;
}

/* The thread's share of y = the `n` Parts' outputs one after another, for each of the M rows of x
 * (K numbers each, row stride xs; row stride ys in y); no barrier: the caller waits where another
 * thread's outputs are read. */
static void matvec_share(float *y, int64_t ys, const Part *parts, int n, const float *x, int64_t xs, int64_t K,
                         int64_t M, Thread *th) {
    th->quantized[0] = th->quantized[1] = NULL;  /* a new product: x holds other numbers */
    float *out = y;
    for (int p = 0; p < n; out += parts[p].rows, p++) {
        int64_t n0, n1;
        share(&parts[p], th->t, th->T, &n0, &n1);
        part_rows(out, ys, &parts[p], x, xs, K, M, n0, n1, th);
    }
}

/* x += W a + b over the thread's share of one Part's outputs, each of the rows (a: K numbers a row, row
 * stride as; y: scratch of rows x D), then a barrier: x whole. */
static void residual(float *x, float *y, const Part *p, const float *a, int64_t as, int64_t K, Thread *th,
                     const Shape *s) {
    int64_t n0, n1;
    matvec_share(y, s->D, p, 1, a, as, K, s->rows, th);
    share(p, th->t, th->T, &n0, &n1);
    for (int64_t m = 0; m < s->rows; m++)
        for (int64_t j = n0; j < n1; j++) x[m * s->D + j] += y[m * s->D + j];
    #pragma omp barrier
}

static void rope(float *x, const float *cos, const float *sin, int64_t Dh) {  /* x*cos + rotate_half(x)*sin */
    int64_t h = Dh / 2;
    for (int64_t j = 0; j < h; j++) {
        float a = x[j], b = x[j + h];
        x[j] = a * cos[j] - b * sin[j];
        x[j + h] = b * cos[j + h] + a * sin[j + h];
    }
}

/* One head: softmax(q K^T / sqrt(Dh)) V over positions 0 .. n - 1, keys and values (n, Dh) each. Where
 * Dh is a multiple of 16 (up to 256), AVX-512 with q and the output held in registers (a position's
 * score summed over Dh as the plain loop's vectorized sum; each output summed over the positions in
 * order, as the plain loop). */
static void attend(float *restrict out, const float *restrict q, const float *restrict keys,
                   const float *restrict values, float *restrict scores, int64_t n, int64_t Dh) {
    const int64_t c = Dh / 16;
    const float scale = 1.0f / sqrtf((float)Dh);
    float top = -INFINITY, sum = 0.0f;
    if (Dh % 16 || c > 16) {
        for (int64_t t = 0; t < n; t++) {
            float d = 0.0f;
            for (int64_t j = 0; j < Dh; j++) d += q[j] * keys[t * Dh + j];
            scores[t] = d * scale;
            top = scores[t] > top ? scores[t] : top;
        }
    } else {
        __m512 qv[16];
        for (int64_t i = 0; i < c; i++) qv[i] = _mm512_loadu_ps(q + 16 * i);
        for (int64_t t = 0; t < n; t++) {
            const float *k = keys + t * Dh;
            __m512 acc = _mm512_mul_ps(qv[0], _mm512_loadu_ps(k));
            for (int64_t i = 1; i < c; i++) acc = _mm512_fmadd_ps(qv[i], _mm512_loadu_ps(k + 16 * i), acc);
            scores[t] = _mm512_reduce_add_ps(acc) * scale;
            top = scores[t] > top ? scores[t] : top;
        }
    }
    for (int64_t t = 0; t < n; t++) sum += (scores[t] = expf(scores[t] - top));
    for (int64_t t = 0; t < n; t++) scores[t] = scores[t] / sum;
    if (Dh % 16) {
        for (int64_t j = 0; j < Dh; j++) out[j] = 0.0f;
        for (int64_t t = 0; t < n; t++)
            for (int64_t j = 0; j < Dh; j++) out[j] += scores[t] * values[t * Dh + j];
        return;
    }
    for (int64_t j = 0; j < Dh; j += 64) {  /* up to four vectors of outputs at a time, in registers */
        int64_t m = (Dh - j) / 16 < 4 ? (Dh - j) / 16 : 4;
        __m512 o0 = _mm512_setzero_ps(), o1 = o0, o2 = o0, o3 = o0;
        const float *v = values + j;
        if (m == 4)
            for (int64_t t = 0; t < n; t++, v += Dh) {
                __m512 a = _mm512_set1_ps(scores[t]);
                o0 = _mm512_fmadd_ps(a, _mm512_loadu_ps(v), o0);
                o1 = _mm512_fmadd_ps(a, _mm512_loadu_ps(v + 16), o1);
                o2 = _mm512_fmadd_ps(a, _mm512_loadu_ps(v + 32), o2);
                o3 = _mm512_fmadd_ps(a, _mm512_loadu_ps(v + 48), o3);
            }
        else
            for (int64_t t = 0; t < n; t++, v += Dh) {
                __m512 a = _mm512_set1_ps(scores[t]);
                o0 = _mm512_fmadd_ps(a, _mm512_loadu_ps(v), o0);
                if (m > 1) o1 = _mm512_fmadd_ps(a, _mm512_loadu_ps(v + 16), o1);
                if (m > 2) o2 = _mm512_fmadd_ps(a, _mm512_loadu_ps(v + 32), o2);
            }
        __m512 o[4] = {o0, o1, o2, o3};
        for (int64_t i = 0; i < m; i++) _mm512_storeu_ps(out + j + 16 * i, o[i]);
    }
}

/* Key/value heads g0 <= g < g1 and their query heads, for each row m (qkv's row m, position pos + m):
 * RoPE, the new keys and values into the cache, then attention over positions 0 .. pos + m into att. */
static void attend_groups(float *att, float *qkv, const Layer *L, const float *cos, const float *sin,
                          int64_t g0, int64_t g1, Thread *th, const Shape *s) {
    int64_t H = s->H, Hkv = s->Hkv, Dh = s->Dh, G = H / Hkv, width = (H + 2 * Hkv) * Dh;
    for (int64_t g = g0; g < g1; g++) {
        float *keys = L->keys + g * s->slots * Dh, *values = L->values + g * s->slots * Dh;
        for (int64_t m = 0; m < s->rows; m++) {
            float *row = qkv + m * width, *k = row + (H + g) * Dh, *v = row + (H + Hkv + g) * Dh;
            if (s->rope) {
                rope(k, cos + m * Dh, sin + m * Dh, Dh);
                for (int64_t h = g * G; h < (g + 1) * G; h++) rope(row + h * Dh, cos + m * Dh, sin + m * Dh, Dh);
            }
            for (int64_t j = 0; j < Dh; j++) {
                keys[(s->pos + m) * Dh + j] = k[j];
                values[(s->pos + m) * Dh + j] = v[j];
            }
        }
        for (int64_t m = 0; m < s->rows; m++)
            for (int64_t h = g * G; h < (g + 1) * G; h++)
                attend(att + (m * H + h) * Dh, qkv + m * width + h * Dh, keys, values, th->scores, s->pos + m + 1,
                       Dh);
    }
}

/* The shared scratch, rows of: qkv ((H + 2 Hkv) Dh), att (H Dh), y (D), h (2 F). */
typedef struct {
    float *qkv, *att, *y, *h;
} Shared;

static void attention_block(float *x, const Layer *L, const float *cos, const float *sin, const Shared *w,
                            Thread *th, const Shape *s) {
    int64_t D = s->D, H = s->H, Hkv = s->Hkv, Dh = s->Dh, G = H / Hkv, M = s->rows, width = (H + 2 * Hkv) * Dh;
    int64_t g0 = Hkv * th->t / th->T, g1 = Hkv * (th->t + 1) / th->T;
    norm(th->xn, x, L->attn_norm, L->attn_norm_bias, s);
    if (s->split_heads && Hkv % th->T == 0) {  /* each thread its heads' q, k and v rows: no wait */
        th->quantized[0] = th->quantized[1] = NULL;
        part_rows(w->qkv, width, &L->qkv[0], th->xn, D, D, M, g0 * G * Dh, g1 * G * Dh, th);
        part_rows(w->qkv + H * Dh, width, &L->qkv[1], th->xn, D, D, M, g0 * Dh, g1 * Dh, th);
        part_rows(w->qkv + (H + Hkv) * Dh, width, &L->qkv[2], th->xn, D, D, M, g0 * Dh, g1 * Dh, th);
    } else {
        matvec_share(w->qkv, width, L->qkv, 3, th->xn, D, D, M, th);
        #pragma omp barrier
    }
    attend_groups(w->att, w->qkv, L, cos, sin, g0, g1, th, s);
    #pragma omp barrier
    residual(x, w->y, &L->o, w->att, H * Dh, H * Dh, th, s);
}

static float activate(float u, int32_t activation) {
    if (activation == 1)  /* GELU, tanh approximation (GPT-2's gelu_new) */
        return 0.5f * u * (1.0f + tanhf(0.7978845608028654f * (u + 0.044715f * u * u * u)));
    return 0.5f * u * (1.0f + erff(u * 0.7071067811865476f));  /* GELU */
}

static void activate_rows(float *h, int64_t j0, int64_t j1, const Shape *s) {
    if (s->activation == 0)
        for (int64_t j = j0; j < j1; j++) h[j] = h[j] / (1.0f + expf(-h[j])) * h[s->F + j];  /* silu(gate) * up */
    else
        for (int64_t j = j0; j < j1; j++) h[j] = activate(h[j], s->activation);
}

static void ffn_block(float *x, const Layer *L, const Shared *w, Thread *th, const Shape *s) {
    int64_t D = s->D, F = s->F, j0, j1;
    norm(th->xn, x, L->ffn_norm, L->ffn_norm_bias, s);
    matvec_share(w->h, 2 * F, L->up, 2, th->xn, D, D, s->rows, th);
    /* where the gate's rows and the up's split alike (or there is no gate), each thread activates its own */
    if (L->up[1].rows == 0 || (L->up[1].rows == F && L->up[0].kind == L->up[1].kind)) {
        share(&L->up[0], th->t, th->T, &j0, &j1);
    } else {
        #pragma omp barrier
        j0 = F * th->t / th->T / 16 * 16;
        j1 = th->t + 1 == th->T ? F : F * (th->t + 1) / th->T / 16 * 16;
    }
    for (int64_t m = 0; m < s->rows; m++) activate_rows(w->h + m * 2 * F, j0, j1, s);
    #pragma omp barrier
    residual(x, w->y, &L->down, w->h, 2 * F, F, th, s);
}

static int64_t shared_floats(const Shape *s) {
    return (s->rows * ((s->H + 2 * s->Hkv) * s->Dh + s->H * s->Dh + s->D + 2 * s->F) + 15) / 16 * 16;
}

static int64_t own_floats(const Shape *s) {  /* xn and scores, a multiple of 64 bytes */
    return (s->rows * s->D + s->slots + 15) / 16 * 16;
}

/* Floats of scratch decoder_step needs for s->threads threads, s->rows rows and s->slots positions. */
int64_t decoder_step_work(const Shape *s) {
    return shared_floats(s) + (s->threads > 1 ? s->threads : 1) * own_floats(s);
}

/* x: (rows, D) the tokens' embeddings (plus their learned positions), overwritten; cos, sin: (rows, Dh)
 * the positions' tables (unread without RoPE); work: decoder_step_work(s) floats, 64-byte aligned;
 * layers: n_layers of them; head: the output head (no bias); logits: (rows, V); s->rows at most
 * MAX_ROWS (more: nothing is computed). One OpenMP team for the whole step: each thread
 * norms (and quantizes) the row it reads itself, computes its share of each product, its key/value
 * heads' attention and its share of the activations, and waits at a barrier only where it reads what
 * another thread wrote (five a layer, four where the Q/K/V rows split by head). */
void decoder_step(float *x, const Shape *s, const Layer *layers, const float *cos, const float *sin,
                  const float *final_norm, const float *final_norm_bias, const Part *head, const Vnni *v,
                  float *work, float *logits) {
    Shared w;
    if (s->rows < 1 || s->rows > MAX_ROWS)
        return;
    w.qkv = work;
    w.att = w.qkv + s->rows * (s->H + 2 * s->Hkv) * s->Dh;
    w.y = w.att + s->rows * s->H * s->Dh;
    w.h = w.y + s->rows * s->D;
    #pragma omp parallel num_threads(s->threads) if (s->threads > 1)
    {
        Thread th;
        th.t = omp_get_thread_num();
        th.T = omp_get_num_threads();
        th.v = *v;
        if (v->row8) {  /* some Part is INT8 or INT4 */
            th.v.row8 += th.t * v->stride;
            th.v.row4 += th.t * v->stride;
        }
        th.xn = work + shared_floats(s) + th.t * own_floats(s);
        th.scores = th.xn + s->rows * s->D;
        for (int64_t i = 0; i < s->n_layers; i++) {
            attention_block(x, &layers[i], cos, sin, &w, &th, s);
            ffn_block(x, &layers[i], &w, &th, s);
        }
        norm(th.xn, x, final_norm, final_norm_bias, s);
        matvec_share(logits, s->V, head, 1, th.xn, s->D, s->D, s->rows, &th);
    }
}
