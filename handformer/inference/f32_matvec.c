/* PackedLinear's one-row kernel (handformer/inference/c_kernels.py builds it): y = x W^T + b in fp32
 * with AVX-512, for decoding's thin products (one or two rows of activations against a large weight).
 * x (M, K) fp32, w (N, K) fp32 row-major, bias (N,) or NULL, y (M, N); K a multiple of 16.
 * Four weight rows at a time are dotted with each activation row: four independent FMA chains that
 * stream four rows of the weight, each weight row read from memory once whatever M is (the rows stay
 * in L1/L2 while the activation rows pass). Output rows split among `threads` OpenMP threads. */
#include <immintrin.h>
#include <stdint.h>

static void dot4(const float *x, const float *w, int64_t K, float *out) {  /* 4 weight rows . x */
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t k = 0; k < K; k += 16) {
        __m512 xk = _mm512_loadu_ps(x + k);
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + k), xk, a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + K + k), xk, a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w + 2 * K + k), xk, a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w + 3 * K + k), xk, a3);
    }
    out[0] = _mm512_reduce_add_ps(a0);
    out[1] = _mm512_reduce_add_ps(a1);
    out[2] = _mm512_reduce_add_ps(a2);
    out[3] = _mm512_reduce_add_ps(a3);
}

static float dot1(const float *x, const float *w, int64_t K) {
    __m512 a = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16)
        a = _mm512_fmadd_ps(_mm512_loadu_ps(w + k), _mm512_loadu_ps(x + k), a);
    return _mm512_reduce_add_ps(a);
}

void f32_linear(const float *x, const float *w, const float *bias, float *y,
                int64_t M, int64_t N, int64_t K, int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < N; n += 4) {
        float out[4];
        for (int64_t m = 0; m < M; m++) {
            if (n + 4 <= N) {
                dot4(x + m * K, w + n * K, K, out);
            } else {  /* the last rows when N is not a multiple of 4 */
                for (int64_t j = n; j < N; j++)
                    out[j - n] = dot1(x + m * K, w + j * K, K);
            }
            for (int64_t j = n; j < N && j < n + 4; j++)
                y[m * N + j] = out[j - n] + (bias ? bias[j] : 0.0f);
        }
    }
}
