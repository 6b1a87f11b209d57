/* One decoding step of a prepared decoder-only model at batch 1, in C (handformer/inference/fused_step.py
 * builds it with gcc and calls it through ctypes): the same computation as CausalLM.forward over one
 * token, without the ~900 PyTorch operator calls and the Python around them. Two kinds of block:
 *   Llama-style: RMSNorm, fused Q/K/V, half-split RoPE, grouped-query attention, SwiGLU (fused gate/up);
 *   GPT-2-style: LayerNorm with a bias, learned positions (added to the embedding by the caller),
 *                biases on every projection, a plain feed-forward with GELU.
 * Weights are the model's own tensors (fp32, contiguous), handed over as pointers; a matrix is either
 * row-major (N, K) (small models, read by plain loops) or, with s->blocked, in c_kernels.block_rows'
 * layout (PackedLinear's copy: four rows interleaved 16 numbers at a time, AVX-512 FMAs, OpenMP over
 * blocks). The new key and value are written into the model's KV cache buffers, (1, Hkv, slots, Dh)
 * each, at column `pos`. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

typedef struct {
    int64_t n_layers, D, H, Hkv, Dh, F, V, slots, pos;
    float eps;
    int32_t layer_norm;  /* 1: LayerNorm (weight and bias); 0: RMSNorm (weight) */
    int32_t activation;  /* 0: SwiGLU over a fused gate/up of 2F rows; 1: GELU (tanh); 2: GELU (erf) */
    int32_t rope;        /* 1: half-split RoPE over each query and key head */
    int32_t blocked;     /* 1: every matrix in block_rows' layout; 0: row-major */
    int32_t threads;     /* OpenMP threads for the blocked products */
} Shape;

typedef struct {  /* per layer: n_layers pointers each; a bias array may hold NULLs (no bias) */
    const float **attn_norm, **attn_norm_bias, **qkv, **qkv_bias, **o, **o_bias;
    const float **ffn_norm, **ffn_norm_bias, **up, **up_bias, **down, **down_bias;
    float **keys, **values;
} Layers;

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

static void dot4(const float *x, const float *w, int64_t K, float *out) {  /* one block of 4 rows . x */
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t k = 0; k < K; k += 16, w += 64) {
        __m512 xk = _mm512_loadu_ps(x + k);
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w), xk, a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + 16), xk, a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w + 32), xk, a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w + 48), xk, a3);
    }
    out[0] = _mm512_reduce_add_ps(a0);
    out[1] = _mm512_reduce_add_ps(a1);
    out[2] = _mm512_reduce_add_ps(a2);
    out[3] = _mm512_reduce_add_ps(a3);
}

/* y = W x + b, W (N, K): row-major, or blocked (then K is a multiple of 16) */
static void matvec(float *y, const float *w, const float *b, const float *x, int64_t N, int64_t K,
                   const Shape *s) {
    if (s->blocked) {
        int64_t blocks = (N + 3) / 4;
        #pragma omp parallel for num_threads(s->threads) schedule(static) if (s->threads > 1)
        for (int64_t i = 0; i < blocks; i++) {
            float out[4];
            dot4(x, w + i * 4 * K, K, out);
            for (int64_t n = i * 4; n < N && n < i * 4 + 4; n++) y[n] = out[n - i * 4] + (b ? b[n] : 0.0f);
        }
        return;
    }
    for (int64_t n = 0; n < N; n++) {
        const float *row = w + n * K;
        float sum = 0.0f;
        for (int64_t k = 0; k < K; k++) sum += row[k] * x[k];
        y[n] = sum + (b ? b[n] : 0.0f);
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

static void attention_block(float *x, const Layers *L, int64_t i, const float *cos, const float *sin,
                            float *work, const Shape *s) {
    int64_t D = s->D, H = s->H, Hkv = s->Hkv, Dh = s->Dh;
    float *xn = work, *qkv = xn + D, *att = qkv + (H + 2 * Hkv) * Dh, *o = att + H * Dh, *scores = o + D;
    norm(xn, x, L->attn_norm[i], L->attn_norm_bias[i], s);
    matvec(qkv, L->qkv[i], L->qkv_bias[i], xn, (H + 2 * Hkv) * Dh, D, s);
    if (s->rope)
        for (int64_t h = 0; h < H + Hkv; h++) rope(qkv + h * Dh, cos, sin, Dh);  /* queries, then keys */
    for (int64_t g = 0; g < Hkv; g++)
        for (int64_t j = 0; j < Dh; j++) {
            L->keys[i][(g * s->slots + s->pos) * Dh + j] = qkv[(H + g) * Dh + j];
            L->values[i][(g * s->slots + s->pos) * Dh + j] = qkv[(H + Hkv + g) * Dh + j];
        }
    for (int64_t h = 0; h < H; h++) {
        int64_t g = h / (H / Hkv);  /* the key/value head this query head shares */
        attend(att + h * Dh, qkv + h * Dh, L->keys[i] + g * s->slots * Dh, L->values[i] + g * s->slots * Dh,
               scores, s);
    }
    matvec(o, L->o[i], L->o_bias[i], att, D, H * Dh, s);
    for (int64_t j = 0; j < D; j++) x[j] += o[j];
}

static float activate(float u, int32_t activation) {
    if (activation == 1)  /* GELU, tanh approximation (GPT-2's gelu_new) */
        return 0.5f * u * (1.0f + tanhf(0.7978845608028654f * (u + 0.044715f * u * u * u)));
    return 0.5f * u * (1.0f + erff(u * 0.7071067811865476f));  /* GELU */
}

static void ffn_block(float *x, const Layers *L, int64_t i, float *work, const Shape *s) {
    int64_t D = s->D, F = s->F, gated = s->activation == 0;
    float *xn = work, *h = xn + D, *y = h + 2 * F;
    norm(xn, x, L->ffn_norm[i], L->ffn_norm_bias[i], s);
    matvec(h, L->up[i], L->up_bias[i], xn, gated ? 2 * F : F, D, s);
    if (gated)
        for (int64_t j = 0; j < F; j++) h[j] = h[j] / (1.0f + expf(-h[j])) * h[F + j];  /* silu(gate) * up */
    else
        for (int64_t j = 0; j < F; j++) h[j] = activate(h[j], s->activation);
    matvec(y, L->down[i], L->down_bias[i], h, D, F, s);
    for (int64_t j = 0; j < D; j++) x[j] += y[j];
}

/* x: (D) the token's embedding (plus its learned position), overwritten; cos, sin: (Dh) the position's
 * tables (unread without RoPE); work: scratch of at least 2 D + 2 (H + 2 Hkv) Dh + 2 F + slots floats;
 * logits: (V). */
void decoder_step(float *x, const Shape *s, const Layers *L, const float *cos, const float *sin,
                  const float *final_norm, const float *final_norm_bias, const float *head, float *work,
                  float *logits) {
    for (int64_t i = 0; i < s->n_layers; i++) {
        attention_block(x, L, i, cos, sin, work, s);
        ffn_block(x, L, i, work, s);
    }
    norm(work, x, final_norm, final_norm_bias, s);
    matvec(logits, head, NULL, work, s->V, s->D, s);
}
