/* Matmuls that read a GGUF's (ggml's) quantized blocks in place (yue/kernels/ggml.py): what the block
 * formats share. Included at the end of rowkernel.c (one shared library), so it uses that file's
 * half_float, quantize_groups, vf / LANES and MAX_R.
 *
 * Design decisions:
 * - Integer dot products on int8 activations, as llama.cpp computes them: the K-quants against
 *   activations quantized per 256 (Q8_K: a float scale per 256, code sums per 16 for the min terms),
 *   the 32-blocks against int8 per 32 (Q8_0 / Q8_1: a scale and a code sum per 32). The weights'
 *   codes and scales are the file's, never re-quantized.
 * - Row-exact: a pass of up to MAX_R rows decodes each weight block once and runs each row's dot on
 *   it; output o of row r is one chain over the blocks in order (integer block sums, then fmaf), the
 *   same whatever the row count, the row's place in the pass or the threads (outputs are split among
 *   them). The integer sums are exact and the float steps are fmaf, so every build (AVX512 with or
 *   without VNNI, AVX2, plain C) gives the same bits for the quantized formats.
 * - Each format's file (q4_k.c, ...) holds a decoder (block bytes -> codes and scales) and a
 *   dequantizer (get_rows: gguf.quants.dequantize's float32 values exactly); the drivers below loop.
 */
#include <string.h>

/* ggml type ids (gguf.GGMLQuantizationType). */
enum {
    GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6, GGML_Q8_0 = 8,
    GGML_Q4_K = 12, GGML_Q5_K = 13, GGML_Q6_K = 14, GGML_BF16 = 30
};

#define QK 256 /* elements of a K-quant super-block (QK_K) */
#define Q32 32 /* elements of a 32-block (Q4_0, Q4_1, Q5_0, Q8_0) */

/* Dequantizers compute as numpy does (a product, then a sum, each rounded): no fused multiply-add. */
#if defined(__clang__)
#define NO_CONTRACT
#else
#define NO_CONTRACT __attribute__((optimize("fp-contract=off")))
#endif

/* ---- Activations: x (rows, in) as int8 codes, a scale per group (256 or 32), code sums per 16 ---- */
struct acts {
    signed char *q; /* (rows, in) codes, round(x * 127 / amax) of the group */
    float *d;       /* (rows, in / group) amax / 127 */
    short *s;       /* (rows, in / 16) sums of each 16 codes: the K-quants' min terms, the 32-blocks' offsets */
};

static struct acts acts_quantize(const float *x, long rows, long in, long group) {
    struct acts a;
    a.q = malloc(rows * in + 64);
    a.d = malloc(rows * (in / group) * sizeof(float));
    a.s = malloc(rows * (in / 16) * sizeof(short));
    quantize_groups(x, rows, in, group, (int *)a.q, a.d, NULL);
    for (long i = 0; i < rows * in / 16; i++) {
        int s = 0;
        for (int k = 0; k < 16; k++) s += a.q[16 * i + k];
        a.s[i] = (short)s;
    }
    return a;
}

static void acts_free(struct acts a) { free(a.q), free(a.d), free(a.s); }

/* ---- Integer dots ---- */

/* sum over a super-block of sc[j] * (q . x over the 16 elements j): q unsigned codes (<= 63), x int8,
 * scw (128) each pair of elements' scale (scale j repeated 8 times: `expand_scales`). Products of
 * pairs fit 16 bits (63 * 127 * 2 < 2^15), so maddubs never saturates. */
static inline __attribute__((always_inline)) int dot_k(const unsigned char *q, const signed char *x,
                                                       const short *scw) {
#if defined(__AVX512BW__)
    __m512i acc = _mm512_setzero_si512();
    for (int c = 0; c < 4; c++) {
        const __m512i p = _mm512_maddubs_epi16(_mm512_loadu_si512(q + 64 * c), _mm512_loadu_si512(x + 64 * c));
#if defined(__AVX512VNNI__)
        acc = _mm512_dpwssd_epi32(acc, p, _mm512_loadu_si512(scw + 32 * c));
#else
        acc = _mm512_add_epi32(acc, _mm512_madd_epi16(p, _mm512_loadu_si512(scw + 32 * c)));
#endif
    }
    return _mm512_reduce_add_epi32(acc);
#elif defined(__AVX2__)
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < 8; c++) {
        const __m256i p = _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(q + 32 * c)),
                                               _mm256_loadu_si256((const __m256i *)(x + 32 * c)));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_loadu_si256((const __m256i *)(scw + 16 * c))));
    }
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
#else
    int total = 0;
    for (int i = 0; i < QK; i += 2) total += (q[i] * x[i] + q[i + 1] * x[i + 1]) * scw[i / 2];
    return total;
#endif
}

/* scw (128) from a super-block's 16 scales: pair i of elements (2i, 2i + 1) gets scale i / 8. */
static inline __attribute__((always_inline)) void expand_scales(const short *sc, short *scw) {
#if defined(__AVX512BW__)
    const __m512i v = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)sc));
    for (int c = 0; c < 4; c++) {
        short idx[32];
        for (int i = 0; i < 32; i++) idx[i] = (short)(4 * c + i / 8);
        _mm512_storeu_si512(scw + 32 * c, _mm512_permutexvar_epi16(_mm512_loadu_si512(idx), v));
    }
#else
    for (int i = 0; i < QK / 2; i++) scw[i] = sc[i / 8];
#endif
}

/* q . x over 32 elements: q unsigned codes (<= 31), x int8. */
static inline __attribute__((always_inline)) int dot_32u(const unsigned char *q, const signed char *x) {
#if defined(__AVX2__)
    const __m256i qv = _mm256_loadu_si256((const __m256i *)q), xv = _mm256_loadu_si256((const __m256i *)x);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    const __m256i acc = _mm256_dpbusd_epi32(_mm256_setzero_si256(), qv, xv);
#elif defined(__AVXVNNI__)
    const __m256i acc = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), qv, xv);
#else
    const __m256i acc = _mm256_madd_epi16(_mm256_maddubs_epi16(qv, xv), _mm256_set1_epi16(1));
#endif
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
#else
    int total = 0;
    for (int i = 0; i < Q32; i++) total += q[i] * x[i];
    return total;
#endif
}

/* q . x over 32 elements, both int8 (-127..127 for x): |q| times x with q's signs, so that the unsigned
 * operand is |q| <= 128 and pairs of products fit 16 bits. */
static inline __attribute__((always_inline)) int dot_32s(const signed char *q, const signed char *x) {
#if defined(__AVX2__)
    const __m256i qv = _mm256_loadu_si256((const __m256i *)q), xv = _mm256_loadu_si256((const __m256i *)x);
    const __m256i xs = _mm256_sign_epi8(xv, qv), aq = _mm256_abs_epi8(qv);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    const __m256i acc = _mm256_dpbusd_epi32(_mm256_setzero_si256(), aq, xs);
#elif defined(__AVXVNNI__)
    const __m256i acc = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), aq, xs);
#else
    const __m256i acc = _mm256_madd_epi16(_mm256_maddubs_epi16(aq, xs), _mm256_set1_epi16(1));
#endif
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
#else
    int total = 0;
    for (int i = 0; i < Q32; i++) total += q[i] * x[i];
    return total;
#endif
}

/* ---- K-quants: a super-block decoded to unsigned codes and integer scales ----
 *
 * A super-block's value at element e (group j = e / 16 of 16) is d * sc[j] * q[e] - dm * mn[j]: Q4_K and
 * Q5_K as stored (mn the 6-bit mins, dm = dmin); Q6_K with q its unsigned 6-bit code, mn = 32 sc and
 * dm = d (q - 32 = its signed code). So a row's block sum is d dx (sum_j sc[j] q.x) - dm dx (sum_j
 * mn[j] s[j]), s the activations' sums per 16. */
struct kblock {
    unsigned char q[QK];
    short scw[QK / 2]; /* expand_scales of the 16 scales */
    short sc[16], mn[16];
    float d, dm;
} __attribute__((aligned(64)));

typedef void (*kdecode_fn)(const unsigned char *blk, struct kblock *k);

/* y (rows, out) = x (rows, in) @ W^T, W `out` rows of in / QK super-blocks of `bytes` each. */
static inline __attribute__((always_inline)) void k_matmul(kdecode_fn decode, long bytes, const float *x, long rows,
                                                           long in, const unsigned char *w, float *y, long out,
                                                           int threads) {
    const long nb = in / QK;
    struct acts a = acts_quantize(x, rows, in, QK);
    for (long r0 = 0; r0 < rows; r0 += MAX_R) {
        const long R = rows - r0 < MAX_R ? rows - r0 : MAX_R;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
        for (long o = 0; o < out; o++) {
            struct kblock k;
            float acc[MAX_R] = {0};
            for (long b = 0; b < nb; b++) {
                decode(w + (o * nb + b) * bytes, &k);
                for (long r = 0; r < R; r++) {
                    const long g = (r0 + r) * nb + b;
                    int msum = 0;
                    for (int j = 0; j < 16; j++) msum += k.mn[j] * a.s[g * 16 + j];
                    acc[r] = fmaf(k.d * a.d[g], (float)dot_k(k.q, a.q + g * QK, k.scw), acc[r]);
                    acc[r] = fmaf(-k.dm * a.d[g], (float)msum, acc[r]);
                }
            }
            for (long r = 0; r < R; r++) y[(r0 + r) * out + o] = acc[r];
        }
    }
    acts_free(a);
}

/* ---- 32-blocks: a block decoded to codes and float scales ----
 *
 * A block's value at element e is d * (q[e] - off) + m: Q4_0 (off 8), Q5_0 (off 16), Q4_1 (off 0, m its
 * min), all with unsigned codes q; Q8_0 with signed codes (sq, off 0). A row's block sum is d dx (q.x -
 * off s) + m dx s, s the activations' code sum over the block. */
struct block32 {
    unsigned char q[Q32];
    signed char sq[Q32];
    float d, m;
};

typedef void (*decode32_fn)(const unsigned char *blk, struct block32 *k);

/* y (rows, out) = x (rows, in) @ W^T, W `out` rows of in / 32 blocks of `bytes`; `off` and `has_m` as above,
 * `is_signed` for Q8_0's signed codes. */
static inline __attribute__((always_inline)) void b32_matmul(decode32_fn decode, long bytes, int off, int has_m,
                                                             int is_signed, const float *x, long rows, long in,
                                                             const unsigned char *w, float *y, long out,
                                                             int threads) {
    const long nb = in / Q32;
    struct acts a = acts_quantize(x, rows, in, Q32);
    for (long r0 = 0; r0 < rows; r0 += MAX_R) {
        const long R = rows - r0 < MAX_R ? rows - r0 : MAX_R;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
        for (long o = 0; o < out; o++) {
            struct block32 k;
            float acc[MAX_R] = {0};
            for (long b = 0; b < nb; b++) {
                decode(w + (o * nb + b) * bytes, &k);
                for (long r = 0; r < R; r++) {
                    const long g = (r0 + r) * nb + b;
                    const signed char *xq = a.q + g * Q32;
                    const int s = a.s[2 * g] + a.s[2 * g + 1];
                    const int dot = is_signed ? dot_32s(k.sq, xq) : dot_32u(k.q, xq) - off * s;
                    acc[r] = fmaf(k.d * a.d[g], (float)dot, acc[r]);
                    if (has_m) acc[r] = fmaf(k.m * a.d[g], (float)s, acc[r]);
                }
            }
            for (long r = 0; r < R; r++) y[(r0 + r) * out + o] = acc[r];
        }
    }
    acts_free(a);
}

/* Rows ids[0..n) of W (each `in` wide, in / elems blocks of `bytes`) dequantized by `deq` into out (n, in). */
static void blocks_get_rows(void (*deq)(const unsigned char *, float *), long elems, long bytes,
                            const unsigned char *w, long in, const long *ids, long n, float *out) {
    const long nb = in / elems;
    for (long i = 0; i < n; i++)
        for (long b = 0; b < nb; b++) deq(w + (ids[i] * nb + b) * bytes, out + i * in + b * elems);
}

/* A little-endian float16 at p, as a float. */
static inline float half_at(const unsigned char *p) { return half_float((unsigned short)(p[0] | p[1] << 8)); }
