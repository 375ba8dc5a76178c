/* Q4_K (ggml type 12): super-blocks of 256 in 144 bytes: d, dmin (float16), 12 bytes of 6-bit scales and
 * mins for the 8 groups of 32, then 128 bytes of 4-bit codes (byte 32 c + l: element 64 c + l in its low
 * nibble, 64 c + 32 + l in its high one). Value: d sc q - dmin m. */
#define Q4_K_BYTES 144

/* The scales and mins of a Q4_K / Q5_K super-block (its 12 bytes at s, gguf's Q4_K.get_scale_min): the
 * scales per group of 16 (each group of 32's twice), the mins per group of 32; and d, dmin. Bytes 0-3 hold
 * scales 0-3 and the high bits of scales 4-7, 4-7 mins 0-3 and the high bits of mins 4-7, 8-11 the low bits
 * of scales and mins 4-7: one word of each four. */
static inline __attribute__((always_inline)) void k_scales(const unsigned char *blk, struct kblock *k) {
    unsigned u[4];
    memcpy(u, blk + 4, 12);
    u[3] = ((u[2] >> 4) & 0x0f0f0f0f) | (((u[1] >> 6) & 0x03030303) << 4); /* mins 4-7 */
    const unsigned mins = u[1] & 0x3f3f3f3f;                                 /* mins 0-3 */
    u[1] = (u[2] & 0x0f0f0f0f) | (((u[0] >> 6) & 0x03030303) << 4);        /* scales 4-7 */
    u[2] = mins;
    u[0] &= 0x3f3f3f3f; /* scales 0-3 */
#if defined(__AVX2__)
    /* 8 bytes to 8 shorts, each twice (groups 2 j, 2 j + 1) */
    const __m128i sc = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)((unsigned long long)u[1] << 32 | u[0])));
    const __m128i mn = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)((unsigned long long)u[3] << 32 | u[2])));
    k->d = half_at(blk), k->dm = half_at(blk + 2);
    k_set_scales(k, _mm256_set_m128i(_mm_unpackhi_epi16(sc, sc), _mm_unpacklo_epi16(sc, sc)));
    k_set_mins32(k, mn);
#else
    const unsigned char *b = (const unsigned char *)u;
    scales16 sc;
    mins8 mn;
    for (int j = 0; j < 16; j++) sc.v[j] = b[j / 2];
    for (int g = 0; g < 8; g++) mn.v[g] = b[8 + g];
    k->d = half_at(blk), k->dm = half_at(blk + 2);
    k_set_scales(k, sc);
    k_set_mins32(k, mn);
#endif
}

/* 128 bytes of Q4_K-ordered nibbles at qs into 256 codes in element order, with Q5_K's fifth bits from qh
 * (bit i of byte l: element 32 i + l) where qh is not NULL. Whole vectors stored as they are loaded
 * again (a wider load of narrower stores would wait for them). */
static inline __attribute__((always_inline)) void k_codes(const unsigned char *qs, const unsigned char *qh,
                                                          unsigned char *q) {
#if defined(__AVX512BW__)
    const __m512i m4 = _mm512_set1_epi8(15), one = _mm512_set1_epi8(1);
    const __m512i hb = qh ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qh)) : m4;
    for (int h = 0; h < 2; h++) { /* 64 bytes: elements 128 h .. 128 h + 127 */
        const __m512i v = _mm512_loadu_si512(qs + 64 * h);
        const __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        for (int c = 0; c < 2; c++) { /* elements 128 h + 64 c ..: groups of 32 i = 4 h + 2 c, i + 1 */
            __m512i codes = _mm512_shuffle_i64x2(lo, hi, c ? 0xEE : 0x44);
            if (qh) {
                const int i = 4 * h + 2 * c;
                const __m512i shift = _mm512_inserti64x4(_mm512_set1_epi16((short)i), _mm256_set1_epi16((short)(i + 1)), 1);
                const __m512i bit = _mm512_and_si512(_mm512_srlv_epi16(hb, shift), one);
                codes = _mm512_or_si512(codes, _mm512_slli_epi16(bit, 4));
            }
            _mm512_store_si512(q + 128 * h + 64 * c, codes);
        }
    }
#elif defined(__AVX2__)
    const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    const __m256i hb = qh ? _mm256_loadu_si256((const __m256i *)qh) : m4;
    for (int c = 0; c < 4; c++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (qh) {
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * c), one), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * c + 1), one), 4));
        }
        _mm256_store_si256((__m256i *)(q + 64 * c), lo);
        _mm256_store_si256((__m256i *)(q + 64 * c + 32), hi);
    }
#else
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) q[64 * c + l] = qs[32 * c + l] & 15, q[64 * c + 32 + l] = qs[32 * c + l] >> 4;
    if (qh)
        for (int i = 0; i < 8; i++)
            for (int l = 0; l < 32; l++) q[32 * i + l] |= ((qh[l] >> i) & 1) << 4;
#endif
}

static inline __attribute__((always_inline)) void q4_k_decode(const unsigned char *blk, struct kblock *k) {
    k_scales(blk, k);
    k_codes(blk + 16, NULL, k->q);
}

/* (d sc) q - (dmin m) per group of 32, as gguf.quants dequantizes. */
static NO_CONTRACT void q4_k_dequant(const unsigned char *blk, float *out) {
    struct kblock k;
    q4_k_decode(blk, &k);
    k_dequant_mins32(&k, out);
}

static void q4_k_outputs(const struct acts *a, long r0, int R, long nb, const unsigned char *wo, float *y, long out) {
    k_outputs(q4_k_decode, Q4_K_BYTES, MINS32, a, r0, R, nb, wo, y, out);
}

static void q4_k_matmul(const float *x, long rows, long in, const unsigned char *w, float *y, long out, int threads) {
    k_matmul(q4_k_outputs, Q4_K_BYTES, MINS32, x, rows, in, w, y, out, threads);
}
