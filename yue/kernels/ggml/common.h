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
 *   a fixed tree (struct kacc, struct bacc): the same whatever the row count, the row's place in the
 *   pass or the threads (outputs are split among them). The lanes are defined by element, not by
 *   vector width, so every build (AVX512 with or without VNNI, AVX2 with or without AVX-VNNI, plain C)
 *   gives the same bits for the quantized formats; the float formats' lanes are the build's vectors.
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
    float *t;       /* (in / group, rows, group / 16) each sum times its group's scale: the K-quants' min terms */
};

static struct acts acts_quantize(const float *x, long rows, long in, long group) {
    const long groups = in / group, sums = group / 16;
    struct acts a = {rows, malloc(rows * in + 64), malloc(rows * groups * sizeof(float)),
                     malloc(rows * in / 16 * sizeof(short)), malloc(rows * in / 16 * sizeof(float))};
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
                a.s[e * sums + k] = (short)sum, a.t[e * sums + k] = a.d[e] * (float)sum;
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

/* v's n lanes added in a fixed tree (n a power of two). */
static inline float lanes_tree(float *v, int n) {
    for (int w = n / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) v[l] += v[l + w];
    return v[0];
}

#if defined(__AVX512BW__)
#define K_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#define K_AVX2 1
#endif
#if defined(__AVX2__) && defined(__FMA__)
#define B_AVX2 1
#endif

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

/* ---- K-quants: a super-block decoded to unsigned codes and integer scales ----
 *
 * A super-block's value at element e (group j = e / 16 of 16) is d sc[j] q[e] - dm mn[j]: Q4_K and Q5_K
 * as stored (mn the 6-bit mins, dm = dmin); Q6_K with q its unsigned 6-bit code, mn = 32 sc and dm = d
 * (q - 32 is its signed code). So a row's block sum is d dx (sum_j sc[j] q.x) - sum_j (dm mn[j]) (dx
 * s[j]), dx its activations' scale and s their sums per 16 (the second factor `acts.t`, the first `wm`,
 * each one product for all rows). */
struct kblock {
    unsigned char q[QK];
    short scp[QK / 4]; /* the scale of each 4 elements' dot, in k_row's packed order (k_set_scales) */
    float wm[16];      /* dm mn[j] */
    short sc[16];      /* (whole vectors, each 64-byte aligned) */
    float d, dm;
} __attribute__((aligned(64)));

typedef void (*kdecode_fn)(const unsigned char *blk, struct kblock *k);

/* 16 shorts, a super-block's scales or mins per group of 16: one AVX2 vector where there is one. */
#if defined(__AVX2__)
typedef __m256i scales16;
#else
typedef struct {
    short v[16];
} scales16;
#endif

/* Where k_row's packed dots put element e's 4-element dot (e / 4 of 64): for 128 elements 128 h + ..,
 * chunk c = e % 128 / 64, its dot lane i = e % 64 / 4 goes to 16-bit slot 32 h + 8 (i / 4) + 4 c + i % 4
 * (packs_epi32 of the two chunks' dots interleaves them per 128 bits), and pairs of slots to 32-bit lane
 * slot / 2 % 16 of the block's sums. */
static inline __attribute__((always_inline)) int k_slot(int e) {
    const int c = e % 128 / 64, i = e % 64 / 4;
    return 32 * (e / 128) + 8 * (i / 4) + 4 * c + i % 4;
}

/* scp, sc and wm from the 16 groups' scales sc and mins mn (after d and dm): slot s of scp holds the
 * scale of group 8 (s / 32) + s % 32 / 8 + 4 (s % 8 / 4) (k_slot's inverse, by group). */
static inline __attribute__((always_inline)) void k_set_scales(struct kblock *k, scales16 sc, scales16 mn) {
#if defined(__AVX2__)
    static const short idx[64] = {0,  0,  0,  0,  4,  4,  4,  4,  1,  1,  1,  1,  5,  5,  5,  5,
                                  2,  2,  2,  2,  6,  6,  6,  6,  3,  3,  3,  3,  7,  7,  7,  7,
                                  8,  8,  8,  8,  12, 12, 12, 12, 9,  9,  9,  9,  13, 13, 13, 13,
                                  10, 10, 10, 10, 14, 14, 14, 14, 11, 11, 11, 11, 15, 15, 15, 15};
    _mm256_store_si256((__m256i *)k->sc, sc);
#endif
#if defined(K_AVX512)
    const __m512i v = _mm512_castsi256_si512(sc);
    for (int h = 0; h < 2; h++)
        _mm512_store_si512(k->scp + 32 * h, _mm512_permutexvar_epi16(_mm512_loadu_si512(idx + 32 * h), v));
    _mm512_store_ps(k->wm, _mm512_mul_ps(_mm512_set1_ps(k->dm), _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(mn))));
#elif defined(__AVX2__)
    for (int s = 0; s < QK / 4; s++) k->scp[s] = k->sc[idx[s]];
    for (int h = 0; h < 2; h++) {
        const __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(h ? _mm256_extracti128_si256(mn, 1) : _mm256_castsi256_si128(mn)));
        _mm256_store_ps(k->wm + 8 * h, _mm256_mul_ps(_mm256_set1_ps(k->dm), m));
    }
#else
    memcpy(k->sc, sc.v, sizeof k->sc);
    for (int e = 0; e < QK; e += 4) k->scp[k_slot(e)] = sc.v[e / 16];
    for (int j = 0; j < 16; j++) k->wm[j] = k->dm * (float)mn.v[j];
#endif
}

/* A row-output's partial sums over super-blocks, alike in every build: 16 float lanes f, f[l] one chain
 * over the blocks of + d dx L[l], then - wm[l] t[l] (one register a row: 9 rows' fit beside the block's
 * vectors), L[l] the sum of sc q x over the 4-element dots of the slots 2 l, 2 l + 1, 32 + 2 l,
 * 33 + 2 l (k_slot). The output is tree(f). */
struct kacc {
#if defined(K_AVX512)
    __m512 f;
#elif defined(K_AVX2)
    __m256 f0, f1;
#else
    float f[16];
#endif
};

/* One row's super-block into a: x its 256 codes, t its 16 scaled sums, dd = d dx. Each 4 elements' dot
 * (dpbusd, or maddubs and madd without VNNI: pairs of products < 2^15, no saturation) fits 16 bits
 * (4 * 63 * 127 < 2^15), so two chunks' dots pack into one vector of 16-bit dots, multiplied by their
 * scales in one madd: 6 multiplies a row a block with VNNI. */
static inline __attribute__((always_inline)) void k_row(const struct kblock *k, const signed char *x, const float *t,
                                                        float dd, struct kacc *a) {
#if defined(K_AVX512)
    __m512i acc = _mm512_setzero_si512(), dots[2];
    for (int h = 0; h < 2; h++) {
        for (int c = 0; c < 2; c++) {
            const __m512i qv = _mm512_load_si512(k->q + 128 * h + 64 * c), xv = _mm512_loadu_si512(x + 128 * h + 64 * c);
#if defined(__AVX512VNNI__)
            dots[c] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), qv, xv);
#else
            dots[c] = _mm512_madd_epi16(_mm512_maddubs_epi16(qv, xv), _mm512_set1_epi16(1));
#endif
        }
        const __m512i p = _mm512_packs_epi32(dots[0], dots[1]), sc = _mm512_load_si512(k->scp + 32 * h);
#if defined(__AVX512VNNI__)
        acc = _mm512_dpwssd_epi32(acc, p, sc);
#else
        acc = _mm512_add_epi32(acc, _mm512_madd_epi16(p, sc));
#endif
    }
    a->f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_set1_ps(dd), a->f);
    a->f = _mm512_fnmadd_ps(_mm512_load_ps(k->wm), _mm512_loadu_ps(t), a->f);
#elif defined(K_AVX2)
    __m256i acc[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()}; /* 32-bit lanes 0-7, 8-15 */
    for (int h = 0; h < 2; h++)
        for (int half = 0; half < 2; half++) { /* the 128-bit lanes 2 half, 2 half + 1 of AVX512's vectors */
            __m256i dots[2];
            for (int c = 0; c < 2; c++) {
                const long off = 128 * h + 64 * c + 32 * half;
                const __m256i qv = _mm256_load_si256((const __m256i *)(k->q + off));
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(x + off));
#if defined(__AVXVNNI__)
                dots[c] = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), qv, xv);
#else
                dots[c] = _mm256_madd_epi16(_mm256_maddubs_epi16(qv, xv), _mm256_set1_epi16(1));
#endif
            }
            const __m256i p = _mm256_packs_epi32(dots[0], dots[1]);
            const __m256i sc = _mm256_load_si256((const __m256i *)(k->scp + 32 * h + 16 * half));
#if defined(__AVXVNNI__)
            acc[half] = _mm256_dpwssd_avx_epi32(acc[half], p, sc);
#else
            acc[half] = _mm256_add_epi32(acc[half], _mm256_madd_epi16(p, sc));
#endif
        }
    a->f0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[0]), _mm256_set1_ps(dd), a->f0);
    a->f1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[1]), _mm256_set1_ps(dd), a->f1);
    a->f0 = _mm256_fnmadd_ps(_mm256_load_ps(k->wm), _mm256_loadu_ps(t), a->f0);
    a->f1 = _mm256_fnmadd_ps(_mm256_load_ps(k->wm + 8), _mm256_loadu_ps(t + 8), a->f1);
#else
    int L[16] = {0};
    for (int e = 0; e < QK; e++) L[k_slot(e) / 2 % 16] += k->scp[k_slot(e)] * k->q[e] * x[e];
    for (int l = 0; l < 16; l++) a->f[l] = fmaf(-k->wm[l], t[l], fmaf((float)L[l], dd, a->f[l]));
#endif
}

static inline __attribute__((always_inline)) float kacc_sum(const struct kacc *a) {
    float f[16];
#if defined(K_AVX512)
    _mm512_storeu_ps(f, a->f);
#elif defined(K_AVX2)
    _mm256_storeu_ps(f, a->f0), _mm256_storeu_ps(f + 8, a->f1);
#else
    memcpy(f, a->f, sizeof f);
#endif
    return lanes_tree(f, 16);
}

/* Output o of R rows (from r0) of a K-quant matmul: its row wo of nb super-blocks, decoded once each. */
static inline __attribute__((always_inline)) void k_output(kdecode_fn decode, long bytes, const struct acts *a, long r0,
                                                           const int R, long nb, const unsigned char *wo, float *y,
                                                           long out) {
    struct kblock k;
    struct kacc acc[MAX_R];
    UNROLL_ROWS
    for (int r = 0; r < R; r++) acc[r] = (struct kacc){0};
    for (long b = 0; b < nb; b++) {
        const unsigned char *blk = wo + b * bytes;
        for (int l = 0; l < bytes; l += 64) __builtin_prefetch(blk + GGML_PREFETCH + l, 0, 3);
        decode(blk, &k);
    UNROLL_ROWS
        for (int r = 0; r < R; r++) {
            const long g = b * a->rows + r0 + r;
            k_row(&k, a->q + g * QK, a->t + g * 16, k.d * a->d[g], &acc[r]);
        }
    }
    UNROLL_ROWS
    for (int r = 0; r < R; r++) y[(r0 + r) * out] = kacc_sum(&acc[r]);
}

/* y (rows, out) = x (rows, in) @ W^T, W `out` rows of in / QK super-blocks of `bytes` each. */
static inline __attribute__((always_inline)) void k_matmul(kdecode_fn decode, long bytes, const float *x, long rows,
                                                           long in, const unsigned char *w, float *y, long out,
                                                           int threads) {
    const long nb = in / QK;
    struct acts a = acts_quantize(x, rows, in, QK);
    for (long r0 = 0; r0 < rows; r0 += MAX_R) {
        const int R = rows - r0 < MAX_R ? (int)(rows - r0) : MAX_R;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
        for (long o = 0; o < out; o++) {
            const unsigned char *wo = w + o * nb * bytes;
#define K_OUTPUT(N) k_output(decode, bytes, &a, r0, N, nb, wo, y + o, out)
            ROWS_SWITCH(K_OUTPUT);
#undef K_OUTPUT
        }
    }
    acts_free(a);
}

/* ---- 32-blocks: a block decoded to codes and float scales ----
 *
 * A block's value at element e is d sq[e] (Q4_0, Q5_0, Q8_0: signed codes) or d q[e] + m (Q4_1). A row's
 * block sum is d dx (sq.x), taken as |sq| times x with sq's signs (the unsigned operand <= 128, so pairs of
 * products fit 16 bits), or d dx (q.x) + m dx s, s its activations' code sum over the block. */
struct block32 {
    unsigned char q[Q32]; /* the codes (Q4_1), or |sq| */
    signed char sq[Q32];
    float d, m;
} __attribute__((aligned(32)));

typedef void (*decode32_fn)(const unsigned char *blk, struct block32 *k);

/* A row-output's partial sums over blocks, alike in every build: 8 float lanes f, f[i] the chain of d dx
 * L[i], L[i] the products of elements 4 i..4 i + 3; a chain m of m dx s (Q4_1). The output is tree(f) + m. */
struct bacc {
#if defined(B_AVX2)
    __m256 f;
#else
    float f[8];
#endif
    float m;
};

static inline __attribute__((always_inline)) void b_row(const struct block32 *k, const signed char *x, int is_signed,
                                                        float dd, struct bacc *a) {
#if defined(B_AVX2)
    __m256i xv = _mm256_loadu_si256((const __m256i *)x);
    if (is_signed) xv = _mm256_sign_epi8(xv, _mm256_load_si256((const __m256i *)k->sq));
    const __m256i qv = _mm256_load_si256((const __m256i *)k->q);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    const __m256i acc = _mm256_dpbusd_epi32(_mm256_setzero_si256(), qv, xv);
#elif defined(__AVXVNNI__)
    const __m256i acc = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), qv, xv);
#else
    const __m256i acc = _mm256_madd_epi16(_mm256_maddubs_epi16(qv, xv), _mm256_set1_epi16(1));
#endif
    a->f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_set1_ps(dd), a->f);
#else
    for (int i = 0; i < 8; i++) {
        int L = 0;
        for (int e = 4 * i; e < 4 * i + 4; e++) L += (is_signed ? k->sq[e] : k->q[e]) * x[e];
        a->f[i] = fmaf((float)L, dd, a->f[i]);
    }
#endif
}

static inline __attribute__((always_inline)) float bacc_sum(const struct bacc *a) {
    float f[8];
#if defined(B_AVX2)
    _mm256_storeu_ps(f, a->f);
#else
    memcpy(f, a->f, sizeof f);
#endif
    return lanes_tree(f, 8) + a->m;
}

/* Output o of R rows (from r0) of a 32-block matmul: its row wo of nb blocks, decoded once each. */
static inline __attribute__((always_inline)) void b32_output(decode32_fn decode, long bytes, int has_m, int is_signed,
                                                             const struct acts *a, long r0, const int R, long nb,
                                                             const unsigned char *wo, float *y, long out) {
    struct block32 k;
    struct bacc acc[MAX_R];
    UNROLL_ROWS
    for (int r = 0; r < R; r++) acc[r] = (struct bacc){0};
    for (long b = 0; b < nb; b++) {
        decode(wo + b * bytes, &k);
    UNROLL_ROWS
        for (int r = 0; r < R; r++) {
            const long g = b * a->rows + r0 + r;
            b_row(&k, a->q + g * Q32, is_signed, k.d * a->d[g], &acc[r]);
            if (has_m) acc[r].m = fmaf(k.m * a->d[g], (float)(a->s[2 * g] + a->s[2 * g + 1]), acc[r].m);
        }
    }
    UNROLL_ROWS
    for (int r = 0; r < R; r++) y[(r0 + r) * out] = bacc_sum(&acc[r]);
}

/* y (rows, out) = x (rows, in) @ W^T, W `out` rows of in / 32 blocks of `bytes`; `has_m` for Q4_1's min,
 * `is_signed` for signed codes. */
static inline __attribute__((always_inline)) void b32_matmul(decode32_fn decode, long bytes, int has_m, int is_signed,
                                                             const float *x, long rows, long in,
                                                             const unsigned char *w, float *y, long out,
                                                             int threads) {
    const long nb = in / Q32;
    struct acts a = acts_quantize(x, rows, in, Q32);
    for (long r0 = 0; r0 < rows; r0 += MAX_R) {
        const int R = rows - r0 < MAX_R ? (int)(rows - r0) : MAX_R;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
        for (long o = 0; o < out; o++) {
            const unsigned char *wo = w + o * nb * bytes;
#define B_OUTPUT(N) b32_output(decode, bytes, has_m, is_signed, &a, r0, N, nb, wo, y + o, out)
            ROWS_SWITCH(B_OUTPUT);
#undef B_OUTPUT
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
