/* Int8Linear's and Int4Linear's "vnni" kernels (handformer/inference/c_kernels.py builds them):
 * y = x W^T + b for rows of fp32 activations, the weights read as int8 (laid out for the kernel) or
 * as stored (4-bit nibbles), the products done in integers by AVX-512 VNNI (vpdpbusd: 64 unsigned x signed byte
 * products summed four at a time into 16 int32 lanes).
 *
 * The activation row is quantized once per call, as llama.cpp's Q8_0: blocks of 32 numbers, each
 * with its own scale s = max|x| / 127 and int8 values round(x / s). Each block's int32 dot product is
 * exact; it is scaled back by s (times the weight's scale) in fp32.
 *
 * vpdpbusd multiplies an unsigned byte by a signed one. int8 weights w (-127..127) are read as the
 * unsigned bytes w + 128 (the sign bit flipped), and the surplus 128 * sum(x) is taken
 * off by starting each lane's sum at -128 * (its four activations' sum), precomputed once per row: the
 * lanes then hold sum(w x) exactly. int4 weights are unsigned already (q = 0..15 stands for q - 8):
 * the lanes start at -8 * (their eight activations' sum).
 *
 * Shapes: x (M, K) fp32, y (M, N) fp32, bias (N,) fp32 or NULL. int8: q the (N, K) int8 weight in
 * c_kernels.block_int8's layout (below, at TILE), scale (N,) fp32, K a multiple of 32; the outputs in
 * tiles of four by up to four rows, every output summed the same way whatever M is. int4: qs (N, K/2)
 * bytes as Int4Linear stores them (byte j of a row: weight 2j in the low nibble, weight 2j + 1 in the
 * high one), d (N, K/32) float16 scales, K a multiple of 32. Output rows split among `threads`
 * OpenMP threads.
 *
 * Built with gcc -O3 -fopenmp at first use; only vnni_supported() is compiled for any x86-64, the
 * kernels for AVX-512 F/BW/VL + VNNI + F16C, run only where vnni_supported() says 1. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

int vnni_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni")
        && __builtin_cpu_supports("f16c");
}

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")
#include <immintrin.h>

#define BLOCK 32

typedef struct {      /* one activation row, quantized; every array padded with zeros to `chunks` */
    int8_t *q;        /* int8 values, in the order the kernel reads them */
    int32_t *start;   /* each lane's starting sum (the offset correction), 16 a chunk */
    float *scale;     /* each lane's activation scale, 16 a chunk */
} Row;

/* Quantize blocks of 32 of x (K numbers) into q (natural order) and s (K/32 scales). */
static void quantize_blocks(const float *x, int64_t K, int8_t *q, float *s) {
    for (int64_t b = 0; b < K / BLOCK; b++) {
        __m512 lo = _mm512_loadu_ps(x + b * BLOCK), hi = _mm512_loadu_ps(x + b * BLOCK + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
        s[b] = amax / 127.0f;
        __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        _mm_storeu_si128((__m128i *)(q + b * BLOCK), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(lo, inv))));
        _mm_storeu_si128((__m128i *)(q + b * BLOCK + 16),
                         _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(hi, inv))));
    }
}

/* Each lane's sum of its group of `width` bytes of q (one chunk of 64 bytes read `width` / 4 times). */
static __m512i lane_sums(const int8_t *q) {
    const __m512i ones = _mm512_set1_epi8(1);
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_loadu_si512(q));
}

/* int8: chunks of 64 = two blocks; lanes 0-7 the first block, 8-15 the second. */
static void prepare_int8(const float *x, int64_t K, Row *row, int64_t chunks) {
    float s[chunks * 2];
    memset(row->q, 0, chunks * 64);
    memset(s, 0, sizeof s);
    quantize_blocks(x, K, row->q, s);
    for (int64_t c = 0; c < chunks; c++) {
        __m512i sums = lane_sums(row->q + c * 64);
        _mm512_storeu_si512(row->start + c * 16, _mm512_mullo_epi32(sums, _mm512_set1_epi32(-128)));
        __m512 lanes = _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(s[2 * c]), _mm512_set1_ps(s[2 * c + 1]));
        _mm512_storeu_ps(row->scale + c * 16, lanes);
    }
}

/* int4: chunks of 128 = four blocks = 64 weight bytes. The chunk's first 64 activations pair with the
 * low nibbles (block g's even weights at bytes 16g..16g+15), the next 64 with the high nibbles (its
 * odd weights); lanes 4g..4g+3 hold block g in both. */
static void prepare_int4(const float *x, int64_t K, Row *row, int64_t chunks) {
    int8_t natural[chunks * 128];
    float s[chunks * 4];
    memset(natural, 0, sizeof natural);
    memset(s, 0, sizeof s);
    quantize_blocks(x, K, natural, s);
    for (int64_t c = 0; c < chunks; c++) {
        int8_t *lo = row->q + c * 128, *hi = lo + 64;
        for (int j = 0; j < 64; j++) {
            lo[j] = natural[c * 128 + 2 * j];
            hi[j] = natural[c * 128 + 2 * j + 1];
        }
        __m512i sums = _mm512_add_epi32(lane_sums(lo), lane_sums(hi));
        _mm512_storeu_si512(row->start + c * 16, _mm512_mullo_epi32(sums, _mm512_set1_epi32(-8)));
        __m512 lanes = _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
                                             _mm512_castps128_ps512(_mm_loadu_ps(s + 4 * c)));
        _mm512_storeu_ps(row->scale + c * 16, lanes);
    }
}

/* M rows of `bytes` quantized values each, in this thread's scratch memory (kept between calls:
 * a malloc a call costs more than a small layer's product). */
static Row *rows_get(int64_t M, int64_t bytes) {
    static __thread uint8_t *scratch = NULL;
    static __thread int64_t size = 0;
    int64_t head = (M * (int64_t)sizeof(Row) + 63) / 64 * 64, need = head + 3 * M * bytes;
    if (need > size) {
        free(scratch);
        scratch = aligned_alloc(64, need);
        size = need;
    }
    Row *rows = (Row *)scratch;
    for (int64_t m = 0; m < M; m++) {
        uint8_t *base = scratch + head + 3 * m * bytes;
        rows[m].q = (int8_t *)base;
        rows[m].start = (int32_t *)(base + bytes);  /* one int32 a four bytes */
        rows[m].scale = (float *)(base + 2 * bytes);
    }
    return rows;
}

/* int8 weights as c_kernels.block_int8 lays them out: blocks of TILE rows (the last one padded with
 * rows of zeros), each block chunk by chunk, a chunk the TILE rows' 64 bytes one after another, every
 * byte w + 128 (the unsigned byte vpdpbusd reads; K padded to a multiple of 64 with w = 0). A block is
 * one contiguous stream; each chunk of the activations is loaded once for the block's TILE rows. */
#define TILE 4
/* Bytes ahead of the tile's stream each chunk asks the cache for (one software prefetch a 64-byte
 * line): the hardware prefetcher alone left the product at ~0.75 of a plain read's rate on a busy
 * machine (benchmarks/int8_kernel.py). A prefetch past the last block is harmless: it never faults. */
#define PREFETCH 1024

/* Rows x[0..R-1] (R = 1..4) dotted with one block's TILE weight rows: out[r][j] = sum_k w_j[k] x_r[k]
 * (unscaled). Each (r, j) sums its chunks in order in one fp32 accumulator and reduces it the same
 * way whatever R is: a row's outputs are the same alone, in a batch or in a prompt. */
static inline __attribute__((always_inline)) void int8_tile(const uint8_t *w, const Row *x, const int R,
                                                            int64_t chunks, float out[4][TILE]) {
    __m512 acc[4][TILE];
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int j = 0; j < TILE; j++) acc[r][j] = _mm512_setzero_ps();
    for (int64_t c = 0; c < chunks; c++, w += TILE * 64) {
        __m512i wj[TILE];
        #pragma GCC unroll 4
        for (int j = 0; j < TILE; j++) {
            _mm_prefetch((const char *)w + PREFETCH + j * 64, _MM_HINT_T0);
            wj[j] = _mm512_loadu_si512(w + j * 64);
        }
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m512i start = _mm512_load_si512(x[r].start + c * 16), q = _mm512_load_si512(x[r].q + c * 64);
            __m512 s = _mm512_load_ps(x[r].scale + c * 16);
            #pragma GCC unroll 4
            for (int j = 0; j < TILE; j++)
                acc[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(start, wj[j], q)), s, acc[r][j]);
        }
    }
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int j = 0; j < TILE; j++) out[r][j] = _mm512_reduce_add_ps(acc[r][j]);
}

/* y (M, N) for the weight rows of blocks b0 <= b < b1 (rows past N not written): blocks taken 16 at a
 * time (their weights stay in L2), the activation rows four at a time against each. */
static void int8_blocks(const Row *rows, int64_t M, const uint8_t *w, const float *scale, const float *bias,
                        float *y, int64_t N, int64_t b0, int64_t b1, int64_t K) {
    int64_t chunks = (K + 63) / 64, block = chunks * 64 * TILE;
    for (int64_t g = b0; g < b1; g += 16)
        for (int64_t m = 0; m < M; m += 4)
            for (int64_t b = g; b < b1 && b < g + 16; b++) {
                float out[4][TILE];
                int R = M - m < 4 ? (int)(M - m) : 4;
                switch (R) {  /* each count its own unrolled copy */
                    case 1: int8_tile(w + b * block, rows + m, 1, chunks, out); break;
                    case 2: int8_tile(w + b * block, rows + m, 2, chunks, out); break;
                    case 3: int8_tile(w + b * block, rows + m, 3, chunks, out); break;
                    default: int8_tile(w + b * block, rows + m, 4, chunks, out);
                }
                for (int r = 0; r < R; r++)
                    for (int64_t j = 0, n = b * TILE; j < TILE && n < N; j++, n++)
                        y[(m + r) * N + n] = out[r][j] * scale[n] + (bias ? bias[n] : 0.0f);
            }
}

/* Four activation rows from m (a short group repeats its last row). */
static void four_rows(const Row *rows, int64_t m, int64_t M, const Row *x[4]) {
    for (int r = 0; r < 4; r++)
        x[r] = &rows[m + r < M ? m + r : M - 1];
}

/* q: the weight in block_int8's layout. */
void int8_vnni_linear(const float *x, const uint8_t *q, const float *scale, const float *bias, float *y,
                      int64_t M, int64_t N, int64_t K, int threads) {
    int64_t chunks = (K + 63) / 64, blocks = (N + TILE - 1) / TILE;
    Row *rows = rows_get(M, chunks * 64);
    for (int64_t m = 0; m < M; m++)
        prepare_int8(x + m * K, K, &rows[m], chunks);
    #pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int t = omp_get_thread_num(), T = omp_get_num_threads();
        int8_blocks(rows, M, q, scale, bias, y, N, blocks * t / T, blocks * (t + 1) / T, K);
    }
}

/* One chunk (four blocks) of an int4 row: 64 bytes `packed`, their four float16 scales `d4`. */
static inline __m512 int4_chunk(__m512i packed, __m128i d4, const Row *x, int64_t c, __m512 acc) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    const __m512i spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    __m512i lo = _mm512_and_si512(packed, low), hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
    __m512i dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_load_si512(x->start + c * 16), lo,
                                                          _mm512_load_si512(x->q + c * 128)),
                                      hi, _mm512_load_si512(x->q + c * 128 + 64));
    __m512 d = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_cvtph_ps(d4)));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, _mm512_load_ps(x->scale + c * 16)), acc);
}

/* One int4 weight row w (K/2 bytes) with its float16 scales d dotted with one quantized row. The last
 * chunk holds `groups` blocks of 32 (1 to 4). */
static float int4_dot(const uint8_t *w, const uint16_t *d, const Row *x, int64_t chunks, int groups) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + 2 < chunks; c += 2) {  /* two chains in flight; the last chunk (maybe short) below */
        acc0 = int4_chunk(_mm512_loadu_si512(w + c * 64), _mm_loadl_epi64((const __m128i *)(d + c * 4)), x, c, acc0);
        acc1 = int4_chunk(_mm512_loadu_si512(w + c * 64 + 64), _mm_loadl_epi64((const __m128i *)(d + c * 4 + 4)),
                          x, c + 1, acc1);
    }
    for (; c < chunks; c++) {
        int n = c + 1 == chunks ? groups : 4;
        __mmask64 bytes = n == 4 ? ~(__mmask64)0 : (((__mmask64)1 << (16 * n)) - 1);
        acc0 = int4_chunk(_mm512_maskz_loadu_epi8(bytes, w + c * 64),
                          _mm_maskz_loadu_epi16((__mmask8)((1 << n) - 1), d + c * 4), x, c, acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

/* One int4 weight row dotted with four quantized rows (a short group repeats a row): each chunk's
 * nibbles unpacked and its scales spread once for the four. */
static void int4_dot4(const uint8_t *w, const uint16_t *d, const Row *const x[4], int64_t chunks, int groups,
                      float out[4]) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    const __m512i spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t c = 0; c < chunks; c++) {
        int n = c + 1 == chunks ? groups : 4;
        __mmask64 bytes = n == 4 ? ~(__mmask64)0 : (((__mmask64)1 << (16 * n)) - 1);
        __m512i packed = _mm512_maskz_loadu_epi8(bytes, w + c * 64);
        __m512i lo = _mm512_and_si512(packed, low), hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
        __m128 d4 = _mm_cvtph_ps(_mm_maskz_loadu_epi16((__mmask8)((1 << n) - 1), d + c * 4));
        __m512 dl = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(d4));
        for (int r = 0; r < 4; r++) {
            __m512i dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_load_si512(x[r]->start + c * 16), lo,
                                                                  _mm512_load_si512(x[r]->q + c * 128)),
                                              hi, _mm512_load_si512(x[r]->q + c * 128 + 64));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dl, _mm512_load_ps(x[r]->scale + c * 16)),
                                     acc[r]);
        }
    }
    for (int r = 0; r < 4; r++)
        out[r] = _mm512_reduce_add_ps(acc[r]);
}

/* The one-row API that decoder_step.c calls through pointers (the fused step computes exactly what
 * the layers compute, with this machine code): vnni_row_bytes(K, bits) bytes hold one activation row
 * prepared by vnni_prepare (64-byte aligned); int8_vnni_rows / int4_vnni_rows give y[n] for n0 <= n < n1
 * (one thread's share of the outputs). int8_vnni_linear and int4_vnni_linear run the same for M = 1. */
static int64_t chunk_bytes(int64_t K, int bits) {
    return bits == 8 ? (K + 63) / 64 * 64 : (K + 127) / 128 * 128;
}

int64_t vnni_row_bytes(int64_t K, int bits) {
    return 3 * chunk_bytes(K, bits);
}

static Row row_at(const uint8_t *base, int64_t bytes) {
    Row row = {(int8_t *)base, (int32_t *)(base + bytes), (float *)(base + 2 * bytes)};
    return row;
}

void vnni_prepare(const float *x, int64_t K, int bits, uint8_t *out) {
    int64_t bytes = chunk_bytes(K, bits);
    Row row = row_at(out, bytes);
    if (bits == 8)
        prepare_int8(x, K, &row, bytes / 64);
    else
        prepare_int4(x, K, &row, bytes / 128);
}

/* n0 a multiple of TILE (a block's first row); q in block_int8's layout. */
__attribute__((noinline)) void int8_vnni_rows(const uint8_t *prepared, const uint8_t *q, const float *scale,
                                              const float *bias, float *y, int64_t n0, int64_t n1, int64_t K) {
    Row row = row_at(prepared, (K + 63) / 64 * 64);
    int8_blocks(&row, 1, q, scale, bias, y, n1, n0 / TILE, (n1 + TILE - 1) / TILE, K);
}

__attribute__((noinline)) void int4_vnni_rows(const uint8_t *prepared, const uint8_t *qs, const uint16_t *d,
                                              const float *bias, float *y, int64_t n0, int64_t n1, int64_t K) {
    int64_t chunks = (K + 127) / 128, G = K / BLOCK;
    int groups = (int)(G - (chunks - 1) * 4);
    Row row = row_at(prepared, chunks * 128);
    for (int64_t n = n0; n < n1; n++)
        y[n] = int4_dot(qs + n * (K / 2), d + n * G, &row, chunks, groups) + (bias ? bias[n] : 0.0f);
}

/* One row of int4 activations: prepared once, the outputs split among `threads` in contiguous shares. */
static void one_row(const float *x, const void *w, const void *scale, const float *bias, float *y, int64_t N,
                    int64_t K, int threads) {
    Row *rows = rows_get(1, chunk_bytes(K, 4));
    vnni_prepare(x, K, 4, (uint8_t *)rows[0].q);
    #pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int t = omp_get_thread_num(), T = omp_get_num_threads();
        int4_vnni_rows((const uint8_t *)rows[0].q, w, scale, bias, y, N * t / T, N * (t + 1) / T, K);
    }
}

void int4_vnni_linear(const float *x, const uint8_t *qs, const uint16_t *d, const float *bias, float *y,
                      int64_t M, int64_t N, int64_t K, int threads) {
    if (M == 1) {
        one_row(x, qs, d, bias, y, N, K, threads);
        return;
    }
    int64_t chunks = (K + 127) / 128, G = K / BLOCK;
    int groups = (int)(G - (chunks - 1) * 4);
    Row *rows = rows_get(M, chunks * 128);
    for (int64_t m = 0; m < M; m++)
        prepare_int4(x + m * K, K, &rows[m], chunks);
    #pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t n = 0; n < N; n++) {
        float b = bias ? bias[n] : 0.0f;
        for (int64_t m = 0; m < M; m += 4) {
            const Row *x[4];
            float out[4];
            four_rows(rows, m, M, x);
            int4_dot4(qs + n * (K / 2), d + n * G, x, chunks, groups, out);
            for (int r = 0; r < 4 && m + r < M; r++)
                y[(m + r) * N + n] = out[r] + b;
        }
    }
}
