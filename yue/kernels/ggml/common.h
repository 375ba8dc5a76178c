/* Matmuls that read a GGUF's (ggml's) quantized blocks in place (yue/kernels/ggml.py): what the block
 * formats share. Included at the end of rowkernel.c (one shared library), so it uses that file's
 * half_float, quantize_groups, vf / LANES and MAX_R.
 *
 * Design decisions:
 * - Integer dot products on int8 activations, as llama.cpp computes them: the K-quants against
 *   activations quantized per 256 (Q8_K: a float scale per 256, code sums per 16 for the min terms),
 *   the 32-blocks against int8 per 32 (Q8_0: a scale per 32; Q4_1 also the code sum, Q8_1's, for its
 *   min). The weights' codes and scales are the file's, never re-quantized.
 * - Row-exact: a pass of up to MAX_R rows decodes each weight block once and runs each row's dot on
 *   it (extra rows cost their dots, not the weights' bytes or decoding); output o of row r is a fixed
 *   set of lanes, each an fmaf chain over the blocks in order of exact integer partial sums, added in
 *   a fixed tree (struct lanes16): the same whatever the row count, the row's place in the
 *   pass or the threads (outputs are split among them). The lanes are defined by element, not by
 *   vector width, so every build (AVX512 with or without VNNI, AVX2 with or without AVX-VNNI, plain C)
 *   gives the same bits for the quantized formats; the float formats' lanes are the build's vectors.
 * - Each format's file (q4_k.c, ...) holds a decoder (block bytes -> codes and scales) and a
 *   dequantizer (get_rows: gguf.quants.dequantize's float32 values exactly); the loops they share are
 *   kquants.h's (the K-quants) and blocks32.h's (the 32-blocks).
 */
#include <string.h>

/* ggml type ids (gguf.GGMLQuantizationType). */
enum {
    GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6, GGML_Q8_0 = 8,
    GGML_Q4_K = 12, GGML_Q5_K = 13, GGML_Q6_K = 14, GGML_BF16 = 30
};

#define QK 256 /* elements of a K-quant super-block (QK_K) */
#define Q32 32 /* elements of a 32-block (Q4_0, Q4_1, Q5_0, Q8_0) */
#ifndef GGML_PREFETCH
#define GGML_PREFETCH 1024 /* bytes ahead in a weight row that each block prefetches */
#endif

/* Dequantizers compute as numpy does (a product, then a sum, each rounded): no fused multiply-add. */
#if defined(__clang__)
#define NO_CONTRACT
#else
#define NO_CONTRACT __attribute__((optimize("fp-contract=off")))
#endif

/* ---- Activations: x (rows, in) as int8 codes, a scale per group (256 or 32), code sums per 16 ---- */
/* Block-major, so that a pass's rows of one block lie together (one pointer for all the rows): group g of
 * row r (g < in / group) is entry g * rows + r. */
struct acts {
    long rows;
    signed char *q; /* (in / group, rows, group) codes, round(x * 127 / amax) of the group */
    float *d;       /* (in / group, rows) amax / 127 */
    short *s;       /* (in / group, rows, group / 16) sums of each 16 codes: Q4_1's min terms */
    float *t;       /* (in / group, rows, group / mins) the code sum of each `mins` codes (the weights' group of
                     * mins: 16 for Q6_K, 32 for Q4_K, Q5_K) times the group's scale: the K-quants' min terms */
};

static struct acts acts_quantize(const float *x, long rows, long in, long group, long mins) {
    const long groups = in / group, sums = group / 16, per = group / mins;
    struct acts a = {rows, malloc(rows * in + 64), malloc(rows * groups * sizeof(float)),
                     malloc(rows * in / 16 * sizeof(short)), malloc(rows * in / mins * sizeof(float) + 64)};
    signed char *codes = malloc(rows * in + 64);
    float *d = malloc(rows * groups * sizeof(float));
    quantize_groups(x, rows, in, group, (int *)codes, d, NULL); /* row-major */
    for (long r = 0; r < rows; r++)
        for (long g = 0; g < groups; g++) {
            const long e = g * rows + r;
            memcpy(a.q + e * group, codes + (r * groups + g) * group, group);
            a.d[e] = d[r * groups + g];
            for (long k = 0; k < sums; k++) {
                int sum = 0;
                for (int i = 0; i < 16; i++) sum += a.q[e * group + 16 * k + i];
                a.s[e * sums + k] = (short)sum;
            }
            for (long k = 0; k < per; k++) {
                int sum = 0;
                for (long i = 0; i < mins / 16; i++) sum += a.s[e * sums + k * (mins / 16) + i];
                a.t[e * per + k] = a.d[e] * (float)sum;
            }
        }
    free(codes), free(d);
    return a;
}

static void acts_free(struct acts a) { free(a.q), free(a.d), free(a.s), free(a.t); }

/* A little-endian float16 at p, as a float (exact). */
static inline __attribute__((always_inline)) float half_at(const unsigned char *p) {
#if defined(__F16C__)
    return _cvtsh_ss((unsigned short)(p[0] | p[1] << 8));
#else
    return half_float((unsigned short)(p[0] | p[1] << 8));
#endif
}

#if defined(__AVX512BW__)
#define K_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#define K_AVX2 1
#endif

/* A row-output's 16 float lanes (the K-quants' and the 32-blocks' partial sums: kquants.h's and
 * blocks32.h's loops say what each lane chains). */
struct lanes16 {
#if defined(K_AVX512)
    __m512 f;
#elif defined(K_AVX2)
    __m256 f[2];
#else
    float f[16];
#endif
};

/* The lanes added in a fixed tree: 0-7 += 8-15, 0-3 += 4-7, 0-1 += 2-3, 0 += 1 (a + b is b + a), in
 * registers: through a stored array the narrower reloads of a wide store would wait for it, once an
 * output (an output of a 2,048-wide Q4_K row is only 8 super-blocks). */
static inline __attribute__((always_inline)) float lanes16_sum(const struct lanes16 *a) {
#if defined(K_AVX512) || defined(K_AVX2)
#if defined(K_AVX512)
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a->f), _mm512_extractf32x8_ps(a->f, 1));
#else
    const __m256 h = _mm256_add_ps(a->f[0], a->f[1]);
#endif
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
#else
    float v[16];
    memcpy(v, a->f, sizeof v);
    for (int w = 8; w > 0; w /= 2)
        for (int l = 0; l < w; l++) v[l] += v[l + w];
    return v[0];
#endif
}

/* CALL(R) for the pass's row count R (in the caller's scope): with vectors, as a constant (1..MAX_R), so
 * that the rows' sums stay in registers; the plain build's loops take it as it is (one copy, quick to
 * compile). */
#if defined(__AVX2__)
#define ROWS_SWITCH(CALL)                                                                                   \
    switch (R) {                                                                                            \
    case 1: CALL(1); break;                                                                                 \
    case 2: CALL(2); break;                                                                                 \
    case 3: CALL(3); break;                                                                                 \
    case 4: CALL(4); break;                                                                                 \
    case 5: CALL(5); break;                                                                                 \
    case 6: CALL(6); break;                                                                                 \
    case 7: CALL(7); break;                                                                                 \
    case 8: CALL(8); break;                                                                                 \
    default: CALL(9); break;                                                                                \
    }
#define UNROLL_ROWS _Pragma("GCC unroll 9") /* each row's sums in their own registers */
#else
#define ROWS_SWITCH(CALL) CALL(R)
#define UNROLL_ROWS
#endif

/* Rows ids[0..n) of W (each `in` wide, in / elems blocks of `bytes`) dequantized by `deq` into out (n, in). */
static void blocks_get_rows(void (*deq)(const unsigned char *, float *), long elems, long bytes,
                            const unsigned char *w, long in, const long *ids, long n, float *out) {
    const long nb = in / elems;
    for (long i = 0; i < n; i++)
        for (long b = 0; b < nb; b++) deq(w + (ids[i] * nb + b) * bytes, out + i * in + b * elems);
}
