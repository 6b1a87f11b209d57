/* Int8Linear's "c-fp32" kernel (handformer/inference/c_kernels.py builds it): y = x Q^T * scale, the int8
 * weights widened to fp32 in registers (AVX-512), fp32 activations and sums: no bf16 rounding.
 * x (M, K) fp32, q (N, K) int8, scale (N,) fp32, y (M, N) fp32; K a multiple of 16. Output rows
 * split among `threads` OpenMP threads. Built with gcc -O3 -mavx512f -fopenmp at first use. */
#include <immintrin.h>
#include <stdint.h>

static inline __m512 widen16(const int8_t *q) {  /* 16 int8 -> 16 fp32 */
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)));
}

static float dot(const float *x, const int8_t *q, int64_t K) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {  /* two accumulators: two FMA chains in flight */
        acc0 = _mm512_fmadd_ps(widen16(q + k), _mm512_loadu_ps(x + k), acc0);
        acc1 = _mm512_fmadd_ps(widen16(q + k + 16), _mm512_loadu_ps(x + k + 16), acc1);
    }
    for (; k < K; k += 16)
        acc0 = _mm512_fmadd_ps(widen16(q + k), _mm512_loadu_ps(x + k), acc0);
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

void int8_linear(const float *x, const int8_t *q, const float *scale, float *y,
                 int64_t M, int64_t N, int64_t K, int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < N; n++)  /* each weight row read once, for every activation row */
        for (int64_t m = 0; m < M; m++)
            y[m * N + n] = dot(x + m * K, q + n * K, K) * scale[n];
}
