/* Q5_0 (ggml type 6): blocks of 32 in 22 bytes: d (float16), 4 bytes of high bits (bit e of the
 * little-endian word: element e), 16 bytes of low nibbles as Q4_0's. Value: d (q - 16), q 0..31. */
#define Q5_0_BYTES 22

/* HIGH5[v]: byte j is bit j of v moved to bit 4 (0 or 16), the fifth bits of 8 elements from one byte of
 * high bits, so decoding is whole-block byte arithmetic the compiler vectorises (a shift per element by
 * its own count does not). Filled when the library loads. */
static unsigned long long HIGH5[256];

static void __attribute__((constructor)) q5_0_tables(void) {
    for (int v = 0; v < 256; v++) {
        unsigned long long t = 0;
        for (int j = 0; j < 8; j++) t |= (unsigned long long)(((v >> j) & 1) << 4) << (8 * j);
        HIGH5[v] = t;
    }
}

static inline __attribute__((always_inline)) void q5_0_decode(const unsigned char *blk, struct block32 *k) {
    k->d = half_at(blk), k->m = 0.f;
#if defined(B_AVX2)
    /* Nibbles: element l low, 16 + l high; fifth bits: byte e all ones where bit e is set (each byte
     * takes its word's byte e / 8, or-ed with all bits but e % 8, compared with all ones). */
    const __m128i raw = _mm_loadu_si128((const __m128i *)(blk + 6));
    const __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(15));
    unsigned qh;
    memcpy(&qh, blk + 2, 4);
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)qh),
        _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL, 0));
    const __m256i bit = _mm256_cmpeq_epi8(_mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL)),
                                          _mm256_set1_epi8(-1));
    const __m256i sq = _mm256_sub_epi8(_mm256_or_si256(nib, _mm256_and_si256(bit, _mm256_set1_epi8(16))),
                                       _mm256_set1_epi8(16));
    _mm256_store_si256((__m256i *)k->sq, sq);
    _mm256_store_si256((__m256i *)k->q, _mm256_abs_epi8(sq));
#else
    unsigned char hi[Q32], lo[Q32];
    const unsigned long long h[4] = {HIGH5[blk[2]], HIGH5[blk[3]], HIGH5[blk[4]], HIGH5[blk[5]]};
    memcpy(hi, h, Q32); /* hi[e]: element e's fifth bit (bit e of the little-endian word), as 0 or 16 */
    for (int l = 0; l < 16; l++) lo[l] = blk[6 + l] & 15, lo[16 + l] = blk[6 + l] >> 4;
    for (int e = 0; e < Q32; e++) k->sq[e] = (signed char)((lo[e] | hi[e]) - 16);
    for (int e = 0; e < Q32; e++) k->q[e] = (unsigned char)(k->sq[e] < 0 ? -k->sq[e] : k->sq[e]);
#endif
}

static NO_CONTRACT void q5_0_dequant(const unsigned char *blk, float *out) {
    struct block32 k;
    q5_0_decode(blk, &k);
    for (int e = 0; e < Q32; e++) out[e] = k.d * (float)k.sq[e];
}

static void q5_0_outputs(const struct acts *a, long r0, int R, long nb, const unsigned char *wo, float *y, long out) {
    b32_outputs(q5_0_decode, Q5_0_BYTES, 0, 1, a, r0, R, nb, wo, y, out);
}

static void q5_0_matmul(const float *x, long rows, long in, const unsigned char *w, float *y, long out, int threads) {
    b32_matmul(q5_0_outputs, Q5_0_BYTES, x, rows, in, w, y, out, threads);
}
