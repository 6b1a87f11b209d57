/* PackedLinear's one-row kernel (handformer/inference/c_kernels.py builds it): y = x W^T + b in fp32
 * with AVX-512, for decoding's thin products (one or two rows of activations against a large weight).
 * x (M, K) fp32; w the (N, K) weight in blocks of four rows (c_kernels.block_rows): (ceil(N/4), K/16,
 * 4, 16), the four rows of a block interleaved 16 numbers at a time, rows past N zero; bias (N,) or
 * NULL; y (M, N); K a multiple of 16. Each block is one contiguous stream, dotted with an activation
 * row by four independent FMA chains; each weight block is read from memory once whatever M is (it
 * stays in L1/L2 while the activation rows pass). Blocks split among `threads` OpenMP threads. */
#include "dot4.h"

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
