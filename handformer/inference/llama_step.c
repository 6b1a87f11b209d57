/* One decoding step of a small Llama-style model at batch 1, in C (handformer/inference/fused_step.py
 * builds it with gcc and calls it through ctypes): the same computation as CausalLM.forward over one
 * token on the prepared model (fused Q/K/V and gate/up, RMSNorm, half-split RoPE, grouped-query
 * attention, SwiGLU, no biases), without ~900 PyTorch operator calls around it.
 * Weights are the model's own tensors (fp32, contiguous), handed over as pointers; the new key and
 * value are written into the model's KV cache buffers, (1, Hkv, S_max, Dh) each, at column `pos`. */
#include <math.h>
#include <stdint.h>

typedef struct {
    int64_t n_layers, D, H, Hkv, Dh, F, V, slots, pos;
    float eps;
} Shape;

typedef struct {  /* per layer: n_layers pointers each */
    const float **attn_norm, **qkv, **o, **ffn_norm, **gate_up, **down;
    float **keys, **values;
} Layers;

static void rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = w[i] * (x[i] * r);
}

static void matvec(float *y, const float *w, const float *x, int64_t N, int64_t K) {  /* y = W x, W (N, K) */
    for (int64_t n = 0; n < N; n++) {
        const float *row = w + n * K;
        float s = 0.0f;
        for (int64_t k = 0; k < K; k++) s += row[k] * x[k];
        y[n] = s;
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
    rmsnorm(xn, x, L->attn_norm[i], D, s->eps);
    matvec(qkv, L->qkv[i], xn, (H + 2 * Hkv) * Dh, D);
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
    matvec(o, L->o[i], att, D, H * Dh);
    for (int64_t j = 0; j < D; j++) x[j] += o[j];
}

static void ffn_block(float *x, const Layers *L, int64_t i, float *work, const Shape *s) {
    int64_t D = s->D, F = s->F;
    float *xn = work, *gu = xn + D, *y = gu + 2 * F;
    rmsnorm(xn, x, L->ffn_norm[i], D, s->eps);
    matvec(gu, L->gate_up[i], xn, 2 * F, D);
    for (int64_t j = 0; j < F; j++) gu[j] = gu[j] / (1.0f + expf(-gu[j])) * gu[F + j];  /* silu(gate) * up */
    matvec(y, L->down[i], gu, D, F);
    for (int64_t j = 0; j < D; j++) x[j] += y[j];
}

/* x: (D) the token's embedding, overwritten; cos, sin: (Dh) the position's tables; work: scratch of
 * at least 2 D + 2 (H + 2 Hkv) Dh + 2 F + slots floats; logits: (V). */
void llama_step(float *x, const Shape *s, const Layers *L, const float *cos, const float *sin,
                const float *final_norm, const float *head, float *work, float *logits) {
    for (int64_t i = 0; i < s->n_layers; i++) {
        attention_block(x, L, i, cos, sin, work, s);
        ffn_block(x, L, i, work, s);
    }
    rmsnorm(work, x, final_norm, s->D, s->eps);
    matvec(logits, head, work, s->V, s->D);
}
