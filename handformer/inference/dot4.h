/* One block of c_kernels.block_rows' layout (four weight rows interleaved 16 numbers at a time) dotted
 * with the activation row x of K numbers (a multiple of 16): four independent AVX-512 FMA chains, one
 * sum a row in out[0..3]. Included by f32_matvec.c and decoder_step.c (each built with AVX-512 F). */
#ifndef HANDFORMER_DOT4_H
#define HANDFORMER_DOT4_H
#include <immintrin.h>
#include <stdint.h>

static inline void dot4(const float *x, const float *w, int64_t K, float *out) {
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
#endif
