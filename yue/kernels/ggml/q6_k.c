/* Q6_K (ggml type 14): super-blocks of 256 in 210 bytes: 128 bytes of low nibbles, 64 of high 2-bit pairs,
 * 16 int8 scales (one per 16 elements), d (float16). In half h (128 elements), element 128 h + 32 i + l
 * (i 0..3, l 0..31) has low nibble ql[64 h + 32 (i % 2) + l] (>> 4 for i >= 2) and high bits
 * qh[32 h + l] >> 2 i. Value: d sc (q - 32), q 0..63: kblock's form with mn = 32 sc, dm = d. */
#define Q6_K_BYTES 210

static inline __attribute__((always_inline)) void q6_k_decode(const unsigned char *blk, struct kblock *k) {
    const unsigned char *ql = blk, *qh = blk + 128;
#if defined(__AVX512BW__) /* whole vectors stored as k_row loads them (k_codes says why) */
    const __m512i m4 = _mm512_set1_epi8(15), m3 = _mm512_set1_epi8(3 << 4);
    for (int h = 0; h < 2; h++) {
        const __m512i l4 = _mm512_loadu_si512(ql + 64 * h); /* low nibbles: i = 0, 1; high: i = 2, 3 */
        const __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qh + 32 * h)));
        /* bits 2 i, 2 i + 1 of qh as bits 4, 5: shifted left by 4 - 2 i for i = 0, 1, right by 2 i - 4 for 2, 3 */
        const __m512i left = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
        const __m512i right = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
        const __m512i a = _mm512_and_si512(l4, m4), b = _mm512_and_si512(_mm512_srli_epi16(l4, 4), m4);
        _mm512_store_si512(k->q + 128 * h, _mm512_or_si512(a, _mm512_and_si512(_mm512_sllv_epi16(hb, left), m3)));
        _mm512_store_si512(k->q + 128 * h + 64, _mm512_or_si512(b, _mm512_and_si512(_mm512_srlv_epi16(hb, right), m3)));
    }
#elif defined(__AVX2__)
    const __m256i m4 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3 << 4);
    for (int h = 0; h < 2; h++) {
        const __m256i hb = _mm256_loadu_si256((const __m256i *)(qh + 32 * h));
        for (int i = 0; i < 4; i++) {
            const __m256i l4 = _mm256_loadu_si256((const __m256i *)(ql + 64 * h + 32 * (i % 2)));
            const __m256i lo = _mm256_and_si256(i < 2 ? l4 : _mm256_srli_epi16(l4, 4), m4);
            /* bits 2 i, 2 i + 1 of qh as bits 4, 5: shifted by 2 i - 4 (left for i < 2) */
            const __m256i hi = _mm256_and_si256(i < 2 ? _mm256_slli_epi16(hb, 4 - 2 * i) : _mm256_srli_epi16(hb, 2 * i - 4), m3);
            _mm256_store_si256((__m256i *)(k->q + 128 * h + 32 * i), _mm256_or_si256(lo, hi));
        }
    }
#else
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 4; i++)
            for (int l = 0; l < 32; l++) {
                const unsigned char lo = ql[64 * h + 32 * (i % 2) + l] >> (i / 2 * 4) & 15;
                k->q[128 * h + 32 * i + l] = lo | ((qh[32 * h + l] >> (2 * i)) & 3) << 4;
            }
#endif
    k->d = k->dm = half_at(blk + 208);
#if defined(__AVX2__)
    const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
    k_set_scales(k, sc);
    k_set_mins16(k, _mm256_slli_epi16(sc, 5));
#else
    const signed char *s = (const signed char *)(blk + 192);
    scales16 sc, mn;
    for (int j = 0; j < 16; j++) sc.v[j] = s[j], mn.v[j] = (short)(32 * s[j]);
    k_set_scales(k, sc);
    k_set_mins16(k, mn);
#endif
}

/* (d sc) (q - 32), as gguf.quants dequantizes. */
static NO_CONTRACT void q6_k_dequant(const unsigned char *blk, float *out) {
    struct kblock k;
    q6_k_decode(blk, &k);
    for (int e = 0; e < QK; e++) out[e] = (k.d * (float)k.sc[e / 16]) * (float)(k.q[e] - 32);
}

static void q6_k_outputs(const struct acts *a, long r0, int R, long nb, const unsigned char *wo, float *y, long out) {
    k_outputs(q6_k_decode, Q6_K_BYTES, MINS16, a, r0, R, nb, wo, y, out);
}

static void q6_k_matmul(const float *x, long rows, long in, const unsigned char *w, float *y, long out, int threads) {
    k_matmul(q6_k_outputs, Q6_K_BYTES, MINS16, x, rows, in, w, y, out, threads);
}
