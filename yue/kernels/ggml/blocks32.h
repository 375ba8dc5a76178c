/* The 32-blocks' shared decoded form and loops (Q4_0, Q4_1, Q5_0, Q8_0; common.h says how they read). */

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

/* Output o of R rows (from r0), its row wo: b32_output for the pass's R as a constant, instantiated by
 * each format with its decoder and constants (q4_0_output, ...; kquants.h's k_outputs says why). */
static inline __attribute__((always_inline)) void b32_outputs(decode32_fn decode, long bytes, int has_m,
                                                              int is_signed, const struct acts *a, long r0, int R,
                                                              long nb, const unsigned char *wo, float *y,
                                                              long out) {
#define B_OUTPUT(N) b32_output(decode, bytes, has_m, is_signed, a, r0, N, nb, wo, y, out)
    ROWS_SWITCH(B_OUTPUT);
#undef B_OUTPUT
}

typedef void (*b32_outputs_fn)(const struct acts *, long, int, long, const unsigned char *, float *, long);

/* y (rows, out) = x (rows, in) @ W^T, W `out` rows of in / 32 blocks of `bytes`; `outputs` the format's
 * b32_outputs. */
static void b32_matmul(b32_outputs_fn outputs, long bytes, const float *x, long rows, long in,
                       const unsigned char *w, float *y, long out, int threads) {
    const long nb = in / Q32;
    struct acts a = acts_quantize(x, rows, in, Q32);
    for (long r0 = 0; r0 < rows; r0 += MAX_R) {
        const int R = rows - r0 < MAX_R ? (int)(rows - r0) : MAX_R;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
        for (long o = 0; o < out; o++) outputs(&a, r0, R, nb, w + o * nb * bytes, y + o, out);
    }
    acts_free(a);
}
