/* One decoding step of a prepared decoder-only model at batch 1, in C (handformer/inference/fused_step.py
 * builds it with gcc and calls it through ctypes): the same computation as CausalLM.forward over one
 * token, without the ~900 PyTorch operator calls and the Python around them. Two kinds of block:
 *   Llama-style: RMSNorm, fused Q/K/V, half-split RoPE, grouped-query attention, SwiGLU (fused gate/up);
 *   GPT-2-style: LayerNorm with a bias, learned positions (added to the embedding by the caller),
 *                biases on every projection, a plain feed-forward with GELU.
 * Weights are the model's own tensors (contiguous), handed over as pointers. Each product is a list
 * of Parts whose outputs follow one another (q, k and v, or one fused Q/K/V matrix), each of a kind:
 *   PLAIN:   fp32 row-major (N, K) (small models, read by plain loops);
 *   BLOCKED: fp32 in c_kernels.block_rows' layout (PackedLinear's one-row copy: four rows interleaved
 *            16 numbers at a time, AVX-512 FMAs);
 *   INT8, INT4: Int8Linear's weights as its VNNI kernel reads them (c_kernels.block_int8's layout:
 *            four rows interleaved 64 bytes at a time) and Int4Linear's stored nibbles, dotted by
 *            vnni_matvec.c's own one-row functions, which the caller hands over as pointers (Vnni):
 *            the activation row is quantized once for all the Parts that read it, and each output is
 *            the machine code the layers run eagerly, so the numbers are theirs.
 * Outputs split among s->threads OpenMP threads, one contiguous share each. The new key and value are
 * written into the model's KV cache buffers, (1, Hkv, slots, Dh) each, at column `pos`. */
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
    int32_t threads;     /* OpenMP threads for the products */
} Shape;

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
    uint8_t *row8, *row4;  /* vnni_row_bytes(max(D, F), bits) bytes each, 64-byte aligned */
} Vnni;

static void norm(float *out, const float *x, const float *w, const float *b, const Shape *s) {
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

/* This thread's share (of T) of one Part's outputs y = W x + b. */
static void part_rows(float *y, const Part *p, const float *x, int64_t K, int t, int T, const Vnni *v) {
    int64_t N = p->rows, n0 = N * t / T, n1 = N * (t + 1) / T;
    const float *b = p->bias;
    if (p->kind == INT8) {  /* blocks of four rows (c_kernels.block_int8's layout) */
        int64_t blocks = (N + 3) / 4, i1 = blocks * (t + 1) / T;
        v->int8_rows(v->row8, p->w, p->scale, b, y, blocks * t / T * 4, i1 * 4 < N ? i1 * 4 : N, K);
    } else if (p->kind == INT4) {
        v->int4_rows(v->row4, p->w, p->scale, b, y, n0, n1, K);
    } else if (p->kind == BLOCKED) {  /* blocks of four rows, K a multiple of 16 */
        int64_t blocks = (N + 3) / 4;
        for (int64_t i = blocks * t / T; i < blocks * (t + 1) / T; i++) {
            float out[4];
            dot4(x, (const float *)p->w + i * 4 * K, K, out);
            for (int64_t n = i * 4; n < N && n < i * 4 + 4; n++) y[n] = out[n - i * 4] + (b ? b[n] : 0.0f);
        }
    } else {
        for (int64_t n = n0; n < n1; n++) {
            const float *row = (const float *)p->w + n * K;
            float sum = 0.0f;
            for (int64_t k = 0; k < K; k++) sum += row[k] * x[k];
            y[n] = sum + (b ? b[n] : 0.0f);
        }
    }
}

/* y = the `n` Parts' outputs one after another, each W x + b; x (K) quantized once where a Part wants it */
static void matvec(float *y, const Part *parts, int n, const float *x, int64_t K, const Shape *s,
                   const Vnni *v) {
    int8_t quantized[2] = {0, 0};
    for (int p = 0; p < n; p++) {
        int32_t kind = parts[p].kind;
        if (parts[p].rows && (kind == INT8 || kind == INT4) && !quantized[kind - INT8]) {
            v->prepare(x, K, kind == INT8 ? 8 : 4, kind == INT8 ? v->row8 : v->row4);
            quantized[kind - INT8] = 1;
        }
    }
    #pragma omp parallel num_threads(s->threads) if (s->threads > 1)
    {
        int t = omp_get_thread_num(), T = omp_get_num_threads();
        float *out = y;
        for (int p = 0; p < n; out += parts[p].rows, p++)
            part_rows(out, &parts[p], x, K, t, T, v);
    }
}

static void rope(float *x, const float *cos, const float *sin, int64_t Dh) {  /* x*cos + rotate_half(x)*sin */
    int64_t h = Dh / 2;
    for (int64_t j = 0; j < h; j++) {
        float a = x[j], b = x[j + h];
        x[j] = a * cos[j] - b * sin[j];
        x[j + h] = b * cos[j + h] + a * sin[j + h];
    }
}

static void attend(float *out, const float *q, const float *keys, const float *values, float *scores,
                   const Shape *s) {  /* one head: softmax(q K^T / sqrt(Dh)) V over positions 0..pos */
    float scale = 1.0f / sqrtf((float)s->Dh), top = -INFINITY, sum = 0.0f;
    for (int64_t t = 0; t <= s->pos; t++) {
        float d = 0.0f;
        for (int64_t j = 0; j < s->Dh; j++) d += q[j] * keys[t * s->Dh + j];
        scores[t] = d * scale;
        top = scores[t] > top ? scores[t] : top;
    }
    for (int64_t t = 0; t <= s->pos; t++) sum += (scores[t] = expf(scores[t] - top));
    for (int64_t j = 0; j < s->Dh; j++) out[j] = 0.0f;
    for (int64_t t = 0; t <= s->pos; t++) {
        float a = scores[t] / sum;
        for (int64_t j = 0; j < s->Dh; j++) out[j] += a * values[t * s->Dh + j];
    }
}

static void attention_block(float *x, const Layer *L, const float *cos, const float *sin, float *work,
                            const Shape *s, const Vnni *v) {
    int64_t D = s->D, H = s->H, Hkv = s->Hkv, Dh = s->Dh;
    float *xn = work, *qkv = xn + D, *att = qkv + (H + 2 * Hkv) * Dh, *o = att + H * Dh, *scores = o + D;
    norm(xn, x, L->attn_norm, L->attn_norm_bias, s);
    matvec(qkv, L->qkv, 3, xn, D, s, v);
    if (s->rope)
        for (int64_t h = 0; h < H + Hkv; h++) rope(qkv + h * Dh, cos, sin, Dh);  /* queries, then keys */
    for (int64_t g = 0; g < Hkv; g++)
        for (int64_t j = 0; j < Dh; j++) {
            L->keys[(g * s->slots + s->pos) * Dh + j] = qkv[(H + g) * Dh + j];
            L->values[(g * s->slots + s->pos) * Dh + j] = qkv[(H + Hkv + g) * Dh + j];
        }
    for (int64_t h = 0; h < H; h++) {
        int64_t g = h / (H / Hkv);  /* the key/value head this query head shares */
        attend(att + h * Dh, qkv + h * Dh, L->keys + g * s->slots * Dh, L->values + g * s->slots * Dh, scores, s);
    }
    matvec(o, &L->o, 1, att, H * Dh, s, v);
    for (int64_t j = 0; j < D; j++) x[j] += o[j];
}

static float activate(float u, int32_t activation) {
    if (activation == 1)  /* GELU, tanh approximation (GPT-2's gelu_new) */
        return 0.5f * u * (1.0f + tanhf(0.7978845608028654f * (u + 0.044715f * u * u * u)));
    return 0.5f * u * (1.0f + erff(u * 0.7071067811865476f));  /* GELU */
}

static void ffn_block(float *x, const Layer *L, float *work, const Shape *s, const Vnni *v) {
    int64_t D = s->D, F = s->F, gated = s->activation == 0;
    float *xn = work, *h = xn + D, *y = h + 2 * F;
    norm(xn, x, L->ffn_norm, L->ffn_norm_bias, s);
    matvec(h, L->up, 2, xn, D, s, v);
    if (gated)
        for (int64_t j = 0; j < F; j++) h[j] = h[j] / (1.0f + expf(-h[j])) * h[F + j];  /* silu(gate) * up */
    else
        for (int64_t j = 0; j < F; j++) h[j] = activate(h[j], s->activation);
    matvec(y, &L->down, 1, h, F, s, v);
    for (int64_t j = 0; j < D; j++) x[j] += y[j];
}

/* x: (D) the token's embedding (plus its learned position), overwritten; cos, sin: (Dh) the position's
 * tables (unread without RoPE); work: scratch of at least 2 D + 2 (H + 2 Hkv) Dh + 2 F + slots floats;
 * layers: n_layers of them; head: the output head (no bias); logits: (V). */
void decoder_step(float *x, const Shape *s, const Layer *layers, const float *cos, const float *sin,
                  const float *final_norm, const float *final_norm_bias, const Part *head, const Vnni *v,
                  float *work, float *logits) {
    for (int64_t i = 0; i < s->n_layers; i++) {
        attention_block(x, &layers[i], cos, sin, work, s, v);
        ffn_block(x, &layers[i], work, s, v);
    }
    norm(work, x, final_norm, final_norm_bias, s);
    matvec(logits, head, 1, work, s->D, s, v);
}
