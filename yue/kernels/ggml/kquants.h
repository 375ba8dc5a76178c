/* The K-quants' shared decoded form and loops (Q4_K, Q5_K, Q6_K; common.h says how they read). */

/* ---- K-quants: a super-block decoded to unsigned codes and integer scales ----
 *
 * A super-block's value at element e (group j = e / 16 of 16) is d sc[j] q[e] - dm mn[j]: Q4_K and Q5_K
 * as stored (mn the 6-bit mins, one per group of 32, dm = dmin); Q6_K with q its unsigned 6-bit code,
 * mn = 32 sc and dm = d (q - 32 is its signed code). So a row's block sum is d dx (sum_j sc[j] q.x) -
 * sum_g (dm mn[g]) (dx s[g]), dx its activations' scale and s their sums per group of the mins (the
 * second factor `acts.t`, the first `wm`, each one product for all rows).
 * Q4_K's and Q5_K's mins go per 32 (MINS32): 8 lanes, half a block's float work on them. */
struct kblock {
    unsigned char q[QK];
    short scp[QK / 4]; /* the scale of each 4 elements' dot, in k_row's packed order (k_set_scales) */
    float wm[16];      /* dm mn[g]: per group of 16, or (MINS32) of 32 in 0..7 */
    short sc[16];      /* (whole vectors, each 64-byte aligned) */
    float d, dm;
} __attribute__((aligned(64)));

typedef void (*kdecode_fn)(const unsigned char *blk, struct kblock *k);

/* 16 shorts, a super-block's scales or mins per group of 16: one AVX2 vector where there is one. */
#if defined(__AVX2__)
typedef __m256i scales16;
typedef __m128i mins8; /* 8 shorts: the mins per group of 32 */
#else
typedef struct {
    short v[16];
} scales16;
typedef struct {
    short v[8];
} mins8;
#endif

#define MINS16 0 /* k_row's `mins32`: Q6_K */
#define MINS32 1 /* Q4_K, Q5_K */

/* Where k_row's packed dots put element e's 4-element dot (e / 4 of 64): for 128 elements 128 h + ..,
 * chunk c = e % 128 / 64, its dot lane i = e % 64 / 4 goes to 16-bit slot 32 h + 8 (i / 4) + 4 c + i % 4
 * (packs_epi32 of the two chunks' dots interleaves them per 128 bits), and pairs of slots to 32-bit lane
 * slot / 2 % 16 of the block's sums. */
static inline __attribute__((always_inline)) int k_slot(int e) {
    const int c = e % 128 / 64, i = e % 64 / 4;
    return 32 * (e / 128) + 8 * (i / 4) + 4 * c + i % 4;
}

/* scp and sc from the 16 groups' scales sc: slot s of scp holds the scale of group 8 (s / 32) + s % 32 / 8
 * + 4 (s % 8 / 4) (k_slot's inverse, by group). */
static inline __attribute__((always_inline)) void k_set_scales(struct kblock *k, scales16 sc) {
#if defined(__AVX2__)
    _mm256_store_si256((__m256i *)k->sc, sc);
#endif
#if defined(K_AVX512)
    static const short idx[64] = {0,  0,  0,  0,  4,  4,  4,  4,  1,  1,  1,  1,  5,  5,  5,  5,
                                  2,  2,  2,  2,  6,  6,  6,  6,  3,  3,  3,  3,  7,  7,  7,  7,
                                  8,  8,  8,  8,  12, 12, 12, 12, 9,  9,  9,  9,  13, 13, 13, 13,
                                  10, 10, 10, 10, 14, 14, 14, 14, 11, 11, 11, 11, 15, 15, 15, 15};
    const __m512i v = _mm512_castsi256_si512(sc);
    for (int h = 0; h < 2; h++)
        _mm512_store_si512(k->scp + 32 * h, _mm512_permutexvar_epi16(_mm512_loadu_si512(idx + 32 * h), v));
#elif defined(__AVX2__)
    /* The AVX512 branch's idx by byte shuffles within 128-bit lanes: groups 8 h .. 8 h + 7 in both lanes, then per 16 slots
     * lane 0 takes groups 2 half, 2 half + 4 and lane 1 groups 2 half + 1, 2 half + 5 (as idx says). A
     * scalar loop over sc's stored shorts waited on the vector store (most of a Q4_K block on Zen 3). */
#define K_PICK(a, b) 2 * (a), 2 * (a) + 1, 2 * (a), 2 * (a) + 1, 2 * (a), 2 * (a) + 1, 2 * (a), 2 * (a) + 1, \
                     2 * (b), 2 * (b) + 1, 2 * (b), 2 * (b) + 1, 2 * (b), 2 * (b) + 1, 2 * (b), 2 * (b) + 1
    const __m256i pick[2] = {_mm256_setr_epi8(K_PICK(0, 4), K_PICK(1, 5)), _mm256_setr_epi8(K_PICK(2, 6), K_PICK(3, 7))};
#undef K_PICK
    for (int h = 0; h < 2; h++) {
        const __m256i g8 = _mm256_broadcastsi128_si256(h ? _mm256_extracti128_si256(sc, 1) : _mm256_castsi256_si128(sc));
        for (int half = 0; half < 2; half++)
            _mm256_store_si256((__m256i *)(k->scp + 32 * h + 16 * half), _mm256_shuffle_epi8(g8, pick[half]));
    }
#else
    memcpy(k->sc, sc.v, sizeof k->sc);
    for (int e = 0; e < QK; e += 4) k->scp[k_slot(e)] = sc.v[e / 16];
#endif
}

/* wm from the mins per group of 16 (Q6_K; after dm). */
static inline __attribute__((always_inline)) void k_set_mins16(struct kblock *k, scales16 mn) {
#if defined(K_AVX512)
    _mm512_store_ps(k->wm, _mm512_mul_ps(_mm512_set1_ps(k->dm), _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(mn))));
#elif defined(__AVX2__)
    for (int h = 0; h < 2; h++) {
        const __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(h ? _mm256_extracti128_si256(mn, 1) : _mm256_castsi256_si128(mn)));
        _mm256_store_ps(k->wm + 8 * h, _mm256_mul_ps(_mm256_set1_ps(k->dm), m));
    }
#else
    for (int j = 0; j < 16; j++) k->wm[j] = k->dm * (float)mn.v[j];
#endif
}

/* wm[0..7] from the mins per group of 32 (Q4_K, Q5_K; after dm). */
static inline __attribute__((always_inline)) void k_set_mins32(struct kblock *k, mins8 mn) {
#if defined(__AVX2__)
    _mm256_store_ps(k->wm, _mm256_mul_ps(_mm256_set1_ps(k->dm), _mm256_cvtepi32_ps(_mm256_cvtepu16_epi32(mn))));
#else
    for (int g = 0; g < 8; g++) k->wm[g] = k->dm * (float)mn.v[g];
#endif
}

/* A row-output's partial sums over super-blocks (struct lanes16), alike in every build: lane f[l] a chain
 * of adds over the blocks of fma(L[l], d dx, -(wm[l] t[l])) (the product rounded, then one fused step; with
 * mins32 lanes 8-15 subtract 0), L[l] the sum of sc q x over the 4-element dots of the slots 2 l, 2 l + 1,
 * 32 + 2 l, 33 + 2 l (k_slot). One register a row: 9 rows' fit beside the block's vectors. The output is
 * lanes16_sum(f). */

/* One row's super-block into a: x its 256 codes, t its scaled sums (16, or 8 with mins32: lanes 0-7 take
 * the mins' terms, lanes 8-15 none, their fma's subtrahend 0), dd = d dx. Each 4 elements' dot
 * (dpbusd, or maddubs and madd without VNNI: pairs of products < 2^15, no saturation) fits 16 bits
 * (4 * 63 * 127 < 2^15), so two chunks' dots pack into one vector of 16-bit dots, multiplied by their
 * scales in one madd: 6 multiplies a row a block with VNNI. */
static inline __attribute__((always_inline)) void k_row(const struct kblock *k, const signed char *x, const float *t,
                                                        float dd, const int mins32, struct lanes16 *a) {
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
    const __m512 m = mins32 ? _mm512_zextps256_ps512(_mm256_mul_ps(_mm256_load_ps(k->wm), _mm256_loadu_ps(t)))
                            : _mm512_mul_ps(_mm512_load_ps(k->wm), _mm512_loadu_ps(t));
    a->f = _mm512_add_ps(a->f, _mm512_fmsub_ps(_mm512_cvtepi32_ps(acc), _mm512_set1_ps(dd), m));
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
    for (int i = 0; i < 2; i++) {
        const __m256 l = _mm256_cvtepi32_ps(acc[i]), v = _mm256_set1_ps(dd);
        __m256 m = _mm256_setzero_ps();
        if (mins32 && i) /* opaque, or GCC folds fmsub(l, v, 0) to a product and fuses it with the add */
            __asm__("" : "+x"(m));
        else
            m = _mm256_mul_ps(_mm256_load_ps(k->wm + 8 * i), _mm256_loadu_ps(t + 8 * i));
        a->f[i] = _mm256_add_ps(a->f[i], _mm256_fmsub_ps(l, v, m));
    }
#else
    int L[16] = {0};
    for (int e = 0; e < QK; e++) L[k_slot(e) / 2 % 16] += k->scp[k_slot(e)] * k->q[e] * x[e];
    for (int l = 0; l < 16; l++) {
        const float m = mins32 && l >= 8 ? 0.f : k->wm[l] * t[l]; /* rounded (this build has no FMA to contract it into) */
        a->f[l] += fmaf((float)L[l], dd, -m);
    }
#endif
}

/* A decoded Q4_K / Q5_K super-block as gguf.quants dequantizes it: (d sc) q - (dmin m) per group of 32. */
static NO_CONTRACT void k_dequant_mins32(const struct kblock *k, float *out) {
    for (int e = 0; e < QK; e++) {
        const float ds = k->d * (float)k->sc[e / 16];
        out[e] = ds * (float)k->q[e] - k->wm[e / 32];
    }
}

/* Output o of R rows (from r0) of a K-quant matmul: its row wo of nb super-blocks, decoded once each. */
static inline __attribute__((always_inline)) void k_output(kdecode_fn decode, long bytes, const int mins32,
                                                           const struct acts *a, long r0, const int R, long nb,
                                                           const unsigned char *wo, float *y, long out) {
    struct kblock k;
    struct lanes16 acc[MAX_R];
    UNROLL_ROWS
    for (int r = 0; r < R; r++) acc[r] = (struct lanes16){0};
    for (long b = 0; b < nb; b++) {
        const unsigned char *blk = wo + b * bytes;
        for (int l = 0; l < bytes; l += 64) __builtin_prefetch(blk + GGML_PREFETCH + l, 0, 3);
        decode(blk, &k);
    UNROLL_ROWS
        for (int r = 0; r < R; r++) {
            const long g = b * a->rows + r0 + r;
            k_row(&k, a->q + g * QK, a->t + g * (mins32 ? 8 : 16), k.d * a->d[g], mins32, &acc[r]);
        }
    }
    UNROLL_ROWS
    for (int r = 0; r < R; r++) y[(r0 + r) * out] = lanes16_sum(&acc[r]);
}

/* Output o of R rows (from r0), its row wo: k_output for the pass's R as a constant (ROWS_SWITCH). Each
 * format instantiates it with its decoder in a function of its own (q4_k_output, ...), so the decoder
 * inlines: through OpenMP's outlined loop a decoder passed along would be an indirect call a block. */
static inline __attribute__((always_inline)) void k_outputs(kdecode_fn decode, long bytes, const int mins32,
                                                            const struct acts *a, long r0, int R, long nb,
                                                            const unsigned char *wo, float *y, long out) {
#define K_OUTPUT(N) k_output(decode, bytes, mins32, a, r0, N, nb, wo, y, out)
    ROWS_SWITCH(K_OUTPUT);
#undef K_OUTPUT
}

typedef void (*k_outputs_fn)(const struct acts *, long, int, long, const unsigned char *, float *, long);

/* y (rows, out) = x (rows, in) @ W^T, W `out` rows of in / QK super-blocks of `bytes` each; `outputs` the
 * format's k_outputs, mins32 its mins' group (k_row). */
static void k_matmul(k_outputs_fn outputs, long bytes, int mins32, const float *x, long rows, long in,
                     const unsigned char *w, float *y, long out, int threads) {
    const long nb = in / QK;
    struct acts a = acts_quantize(x, rows, in, QK, mins32 ? 32 : 16);
    for (long r0 = 0; r0 < rows; r0 += MAX_R) {
        const int R = rows - r0 < MAX_R ? (int)(rows - r0) : MAX_R;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
        for (long o = 0; o < out; o++) outputs(&a, r0, R, nb, w + o * nb * bytes, y + o, out);
    }
    acts_free(a);
}
