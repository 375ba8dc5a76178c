/* The 32-blocks' shared loops (Q4_0, Q4_1, Q5_0, Q8_0; common.h says how they read).
 *
 * A pass walks a weight row two blocks at a time (a "pair", 64 elements: one AVX512 vector of codes, two
 * AVX2 ones), decodes the pair once, and runs each of the pass's rows on it. What a row's dot needs of its
 * activations is prepared once per row and call (struct acts32), so that a row's work on a pair is, with
 * VNNI, one dpbusd, one int-to-float, one multiply and one fma.
 *
 * The integers. A block's value at element e is d v[e] (+ m for Q4_1), v the signed code (Q4_0: q - 8,
 * Q5_0: q - 16, Q8_0: q) or Q4_1's unsigned one. Each 4 elements' dot L = sum v x (x the row's int8
 * codes) is exact however a build gets it: as the unsigned code u = v + off (off 8, 16; 128 for Q8_0 with
 * dpbusd) times x, plus C = -off (x's sum over the 4), C prepared per row; or, for Q8_0 without dpbusd,
 * as |v| times x with v's signs (maddubs' pairs then stay below 2^15); or as the plain loop's products.
 *
 * The floats, alike in every build (so every build gives the same bits): 16 lanes a row, lane 8 (b % 2)
 * + i the chain over the row's blocks b of even or odd index of fma(L_i, d dx, .), i = element / 4 within
 * the block, d dx = d * dx (one rounded product, dx the row's scale of the block); Q4_1 then adds
 * fma(S_i, m * dx, .), S_i the 4 codes' sum. The output is lanes16_sum(lanes). Extra rows
 * cost their own dots, never the weights' bytes or their decoding. */

#if defined(__AVX512BW__)
#define B_AVX512 1
#define B_SIMD 1
#if defined(__AVX512VNNI__)
#define B_DPBUSD 1
#endif
#elif defined(__AVX2__) && defined(__FMA__)
#define B_AVX2 1
#define B_SIMD 1
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
#define B_DPBUSD 1
#endif
#endif

/* The unsigned-code offset of a signed format in a vector build (the plain loops use v itself). */
#if defined(B_SIMD)
#define B_OFF(off) (off)
#else
#define B_OFF(off) 0
#endif

/* ---- A row's activations for the 32-blocks: row-major, so that a row's pairs are one stream ---- */
struct acts32 {
    long in, nb;
    signed char *q; /* (rows, in) codes, round(x * 127 / amax) of each 32 */
    int *c;         /* (rows, in / 4) -off times each 4 codes' sum (C above); NULL where off is 0 */
    float *dxe;     /* (rows, nb, 8) each block's scale amax / 127, 8 times (one AVX2 vector a block) */
    float *s;       /* (rows, in / 4) each 4 codes' sum as a float (Q4_1's min terms); NULL without */
};

#define ACTS_PAD 64 /* bytes past each array's end: a tail block's whole-pair loads stay inside */

static struct acts32 acts32_quantize(const float *x, long rows, long in, int off, int sums) {
    const long nb = in / Q32, quads = in / 4;
    struct acts32 a = {in, nb, malloc(rows * in + ACTS_PAD), NULL, malloc(rows * nb * 8 * sizeof(float) + ACTS_PAD),
                       NULL};
    float *d = malloc(rows * nb * sizeof(float));
    quantize_groups(x, rows, in, Q32, (int *)a.q, d, NULL); /* row r's codes at q + r in */
    if (off) a.c = malloc(rows * quads * sizeof(int) + ACTS_PAD);
    if (sums) a.s = malloc(rows * quads * sizeof(float) + ACTS_PAD);
    for (long i = 0; i < rows * quads; i++) {
        const signed char *q = a.q + 4 * i;
        const int sum = q[0] + q[1] + q[2] + q[3];
        if (a.c) a.c[i] = -off * sum;
        if (a.s) a.s[i] = (float)sum;
    }
    for (long g = 0; g < rows * nb; g++)
        for (int l = 0; l < 8; l++) a.dxe[8 * g + l] = d[g];
    free(d);
    return a;
}

static void acts32_free(struct acts32 a) { free(a.q), free(a.c), free(a.dxe), free(a.s); }

/* ---- A pair of blocks decoded (each format's decoder fills it; n = 1 leaves the second block empty) ---- */
struct pair32 {
#if defined(B_AVX512)
    __m512i u;      /* element 32 b + e's unsigned code (|v| for Q8_0 without dpbusd) */
    __mmask64 neg;  /* Q8_0 without dpbusd: where v < 0 */
    __m512 d, m;    /* lanes 8 b .. 8 b + 7: block b's d (and m) */
#elif defined(B_AVX2)
    __m256i u[2], v[2]; /* block b's unsigned codes; Q8_0 without dpbusd: |v| and v */
    __m256 d[2], m[2];
#else
    signed char v[2 * Q32]; /* element 32 b + e's value code */
    float d[2], m[2];
#endif
};

/* The integer lanes of one block (AVX2, 32 codes: 8 lanes): u x + C, or |v| x with v's signs (sign). */
#if defined(B_AVX2)
static inline __attribute__((always_inline)) __m256i b_dot8(__m256i u, __m256i v, const signed char *x,
                                                            const int *c, int sign) {
    __m256i xv = _mm256_loadu_si256((const __m256i *)x);
    if (sign) xv = _mm256_sign_epi8(xv, v);
    const __m256i cv = c ? _mm256_loadu_si256((const __m256i *)c) : _mm256_setzero_si256();
#if defined(B_DPBUSD) && defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(cv, u, xv);
#elif defined(B_DPBUSD)
    return _mm256_dpbusd_epi32(cv, u, xv);
#else
    const __m256i l = _mm256_madd_epi16(_mm256_maddubs_epi16(u, xv), _mm256_set1_epi16(1));
    return c ? _mm256_add_epi32(l, cv) : l;
#endif
}
#endif

/* One row on a pair of n blocks: x, c, dxe, s its activations at the pair's first block; sign: Q8_0's
 * signs on x (without dpbusd); has_m: Q4_1's min term. */
static inline __attribute__((always_inline)) void b_pair_row(const struct pair32 *p, int n, const signed char *x,
                                                             const int *c, const float *dxe, const float *s,
                                                             int use_c, int sign, int has_m, struct lanes16 *a) {
#if defined(B_AVX512)
    const __mmask16 lanes = n == 2 ? 0xFFFF : 0x00FF;
    __m512i xv = n == 2 ? _mm512_loadu_si512(x) : _mm512_maskz_loadu_epi8(0xFFFFFFFFULL, x);
    if (sign) xv = _mm512_mask_sub_epi8(xv, p->neg, _mm512_setzero_si512(), xv);
    const __m512i cv = !use_c ? _mm512_setzero_si512() : n == 2 ? _mm512_loadu_si512(c) : _mm512_maskz_loadu_epi32(lanes, c);
#if defined(B_DPBUSD)
    const __m512i l = _mm512_dpbusd_epi32(cv, p->u, xv);
#else
    __m512i l = _mm512_madd_epi16(_mm512_maddubs_epi16(p->u, xv), _mm512_set1_epi16(1));
    if (use_c) l = _mm512_add_epi32(l, cv);
#endif
    const __m512 dx = n == 2 ? _mm512_loadu_ps(dxe) : _mm512_maskz_loadu_ps(lanes, dxe);
    a->f = _mm512_mask3_fmadd_ps(_mm512_cvtepi32_ps(l), _mm512_mul_ps(p->d, dx), a->f, lanes);
    if (has_m) {
        const __m512 sv = n == 2 ? _mm512_loadu_ps(s) : _mm512_maskz_loadu_ps(lanes, s);
        a->f = _mm512_mask3_fmadd_ps(sv, _mm512_mul_ps(p->m, dx), a->f, lanes);
    }
#elif defined(B_AVX2)
    for (int b = 0; b < n; b++) {
        const __m256i l = b_dot8(p->u[b], p->v[b], x + Q32 * b, use_c ? c + 8 * b : NULL, sign);
        const __m256 dx = _mm256_loadu_ps(dxe + 8 * b);
        a->f[b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(l), _mm256_mul_ps(p->d[b], dx), a->f[b]);
        if (has_m) a->f[b] = _mm256_fmadd_ps(_mm256_loadu_ps(s + 8 * b), _mm256_mul_ps(p->m[b], dx), a->f[b]);
    }
#else
    (void)c, (void)use_c, (void)sign;
    for (int b = 0; b < n; b++) {
        const float dd = p->d[b] * dxe[8 * b], md = p->m[b] * dxe[8 * b];
        for (int i = 0; i < 8; i++) {
            int L = 0;
            for (int e = 4 * i; e < 4 * i + 4; e++) L += p->v[Q32 * b + e] * x[Q32 * b + e];
            float f = fmaf((float)L, dd, a->f[8 * b + i]);
            if (has_m) f = fmaf(s[8 * b + i], md, f);
            a->f[8 * b + i] = f;
        }
    }
#endif
}

typedef void (*pair_decode_fn)(const unsigned char *blk, int n, struct pair32 *p);

/* A pass's rows' activations: row r's arrays (struct acts32) from its first block. */
struct rows32 {
    const signed char *q[MAX_R];
    const int *c[MAX_R];
    const float *dxe[MAX_R], *s[MAX_R];
};

/* R rows on the pair of n blocks from block b (n a constant: the loop's and the tail's copies). */
static inline __attribute__((always_inline)) void b_pair_rows(const struct pair32 *p, int n, long b,
                                                              const struct rows32 *x, const int R, int use_c,
                                                              int sign, int has_m, struct lanes16 *acc) {
    UNROLL_ROWS
    for (int r = 0; r < R; r++)
        b_pair_row(p, n, x->q[r] + Q32 * b, use_c ? x->c[r] + 8 * b : NULL, x->dxe[r] + 8 * b,
                   has_m ? x->s[r] + 8 * b : NULL, use_c, sign, has_m, &acc[r]);
}

/* Output o of R rows (from r0) of a 32-block matmul: its row wo of nb blocks, each pair decoded once.
 * use_c: the activations have C (the format's offset is not 0 in this build). */
static inline __attribute__((always_inline)) void b32_output(pair_decode_fn decode, long bytes, int use_c, int sign,
                                                             int has_m, const struct acts32 *a, long r0, const int R,
                                                             const unsigned char *wo, float *y, long out) {
    const long nb = a->nb, quads = a->in / 4;
    struct pair32 p;
    struct lanes16 acc[MAX_R];
    struct rows32 x;
    UNROLL_ROWS
    for (int r = 0; r < R; r++) {
        const long row = r0 + r;
        memset(&acc[r], 0, sizeof acc[r]);
        x.q[r] = a->q + row * a->in, x.dxe[r] = a->dxe + row * nb * 8;
        x.c[r] = use_c ? a->c + row * quads : NULL, x.s[r] = has_m ? a->s + row * quads : NULL;
    }
    long b = 0;
    for (; b + 2 <= nb; b += 2) {
        const unsigned char *blk = wo + b * bytes;
        __builtin_prefetch(blk + GGML_PREFETCH, 0, 3);
        decode(blk, 2, &p);
        b_pair_rows(&p, 2, b, &x, R, use_c, sign, has_m, acc);
    }
    if (b < nb) { /* an odd last block: lanes 0-7 */
        decode(wo + b * bytes, 1, &p);
        b_pair_rows(&p, 1, b, &x, R, use_c, sign, has_m, acc);
    }
    UNROLL_ROWS
    for (int r = 0; r < R; r++) y[(r0 + r) * out] = lanes16_sum(&acc[r]);
}

/* Output o of R rows (from r0), its row wo: b32_output for the pass's R as a constant, instantiated by
 * each format with its decoder and constants (q4_0_outputs, ...; kquants.h's k_outputs says why). */
static inline __attribute__((always_inline)) void b32_outputs(pair_decode_fn decode, long bytes, int use_c, int sign,
                                                              int has_m, const struct acts32 *a, long r0, int R,
                                                              const unsigned char *wo, float *y, long out) {
#define B_OUTPUT(N) b32_output(decode, bytes, use_c, sign, has_m, a, r0, N, wo, y, out)
    ROWS_SWITCH(B_OUTPUT);
#undef B_OUTPUT
}

typedef void (*b32_outputs_fn)(const struct acts32 *, long, int, const unsigned char *, float *, long);

/* y (rows, out) = x (rows, in) @ W^T, W `out` rows of in / 32 blocks of `bytes`; `outputs` the format's
 * b32_outputs, off its unsigned-code offset (C), has_m whether it has Q4_1's min term. */
static void b32_matmul(b32_outputs_fn outputs, long bytes, int off, int has_m, const float *x, long rows, long in,
                       const unsigned char *w, float *y, long out, int threads) {
    const long nb = in / Q32;
    struct acts32 a = acts32_quantize(x, rows, in, off, has_m);
    for (long r0 = 0; r0 < rows; r0 += MAX_R) {
        const int R = rows - r0 < MAX_R ? (int)(rows - r0) : MAX_R;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
        for (long o = 0; o < out; o++) outputs(&a, r0, R, w + o * nb * bytes, y + o, out);
    }
    acts32_free(a);
}

/* ---- Decoding helpers the formats share ---- */

/* The pair's scales: block b's float16 at blk + b bytes + at, in lanes 8 b .. 8 b + 7. */
static inline __attribute__((always_inline)) void b_scales(const unsigned char *blk, long bytes, int at, int n,
                                                           void *dst) {
#if defined(B_AVX512)
    const float d1 = n == 2 ? half_at(blk + bytes + at) : 0.f;
    *(__m512 *)dst = _mm512_insertf32x8(_mm512_set1_ps(half_at(blk + at)), _mm256_set1_ps(d1), 1);
#elif defined(B_AVX2)
    __m256 *d = dst;
    for (int b = 0; b < n; b++) d[b] = _mm256_set1_ps(half_at(blk + b * bytes + at));
#else
    float *d = dst;
    for (int b = 0; b < n; b++) d[b] = half_at(blk + b * bytes + at);
#endif
}

/* The 4-bit codes of n blocks (16 bytes each, at blk + b bytes + at: element l low nibble, 16 + l high)
 * in element order, as unsigned codes (vectors) or minus off (plain: the value codes). */
static inline __attribute__((always_inline)) void b_nibbles(const unsigned char *blk, long bytes, int at, int n,
                                                            int off, struct pair32 *p) {
#if defined(B_AVX512)
    const __m128i r0 = _mm_loadu_si128((const __m128i *)(blk + at));
    const __m128i r1 = n == 2 ? _mm_loadu_si128((const __m128i *)(blk + bytes + at)) : _mm_setzero_si128();
    const __m512i t = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set_m128i(r0, r0)), _mm256_set_m128i(r1, r1), 1);
    const __m512i shift = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0); /* high nibbles in the 2nd and 4th 16 bytes */
    p->u = _mm512_and_si512(_mm512_srlv_epi64(t, shift), _mm512_set1_epi8(15));
    (void)off;
#elif defined(B_AVX2)
    for (int b = 0; b < n; b++) {
        const __m128i r = _mm_loadu_si128((const __m128i *)(blk + b * bytes + at));
        p->u[b] = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(r, 4), r), _mm256_set1_epi8(15));
    }
    (void)off;
#else
    for (int b = 0; b < n; b++)
        for (int l = 0; l < 16; l++) {
            const unsigned char c = blk[b * bytes + at + l];
            p->v[Q32 * b + l] = (signed char)((c & 15) - off), p->v[Q32 * b + 16 + l] = (signed char)((c >> 4) - off);
        }
#endif
}
