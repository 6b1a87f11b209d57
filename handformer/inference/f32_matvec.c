/* PackedLinear's one-row kernel (handformer/inference/c_kernels.py builds it): y = x W^T + b in fp32
 * with AVX-512, for decoding's thin products (one or two rows of activations against a large weight).
 * x (M, K) fp32; w the (N, K) weight in blocks of four rows (c_kernels.block_rows): (ceil(N/4), K/16,
 * 4, 16), the four rows of a block interleaved 16 numbers at a time, rows past N zero; bias (N,) or
 * NULL; y (M, N); K a multiple of 16. Each block is one contiguous stream, dotted with an activation
 * row by four independent FMA chains; each weight block is read from memory once whatever M is (it
 * stays in L1/L2 while the activation rows pass). Blocks split among `threads` OpenMP threads. */
#include <immintrin.h>
#include <stdint.h>

static void dot4(const float *x, const float *w, int64_t K, float *out) {  /* one block . x */
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

void f32_linear(const float *x, const float *w, const float *bias, float *y,
                int64_t M, int64_t N, int64_t K, int threads) {
    int64_t blocks = (N + 3) / 4;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        float out[4];
        for (int64_t m = 0; m < M; m++) {
            dot4(x + m * K, w + b * 4 * K, K, out);
            for (int64_t n = b * 4; n < N && n < b * 4 + 4; n++)  /* the last block may be short */
                y[m * N + n] = out[n - b * 4] + (bias ? bias[n] : 0.0f);
        }
    }
}
