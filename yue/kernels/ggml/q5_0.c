/* Q5_0 (ggml type 6): blocks of 32 in 22 bytes: d (float16), 4 bytes of high bits (bit e of the
 * little-endian word: element e), 16 bytes of low nibbles as Q4_0's. Value: d (q - 16), q 0..31. */
#define Q5_0_BYTES 22

/* HIGH5[v]: byte j is bit j of v moved to bit 4 (0 or 16), the fifth bits of 8 elements from one byte of
 * high bits, so the plain decoder is whole-block byte arithmetic the compiler vectorises (a shift per
 * element by its own count does not). Filled when the library loads. */
static unsigned long long HIGH5[256];

static void __attribute__((constructor)) q5_0_tables(void) {
    for (int v = 0; v < 256; v++) {
        unsigned long long t = 0;
        for (int j = 0; j < 8; j++) t |= (unsigned long long)(((v >> j) & 1) << 4) << (8 * j);
        HIGH5[v] = t;
    }
}

/* A pair of blocks (blocks32.h's struct pair32): codes q (vectors; C is -16 sum x), q - 16 (plain). */
static inline __attribute__((always_inline)) void q5_0_decode(const unsigned char *blk, int n, struct pair32 *p) {
    b_scales(blk, Q5_0_BYTES, 0, n, &p->d);
    b_nibbles(blk, Q5_0_BYTES, 6, n, 0, p);
    unsigned qh[2] = {0, 0};
    for (int b = 0; b < n; b++) memcpy(qh + b, blk + b * Q5_0_BYTES + 2, 4);
#if defined(B_AVX512)
    /* the 64 fifth bits are the pair's byte mask: element 32 b + e's bit e of block b's word */
    const __mmask64 high = (__mmask64)qh[0] | (__mmask64)qh[1] << 32;
    p->u = _mm512_mask_add_epi8(p->u, high, p->u, _mm512_set1_epi8(16));
#elif defined(B_AVX2)
    for (int b = 0; b < n; b++) {
        /* byte e all ones where bit e is set: each byte takes its word's byte e / 8, or-ed with all bits
         * but e % 8, compared with all ones */
        const __m256i spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32((int)qh[b]),
            _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL, 0x0101010101010101LL, 0));
        const __m256i bit = _mm256_cmpeq_epi8(_mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL)),
                                              _mm256_set1_epi8(-1));
        p->u[b] = _mm256_or_si256(p->u[b], _mm256_and_si256(bit, _mm256_set1_epi8(16)));
    }
#else
    for (int b = 0; b < n; b++) {
        unsigned char hi[Q32];
        const unsigned char *h = (const unsigned char *)(qh + b);
        const unsigned long long t[4] = {HIGH5[h[0]], HIGH5[h[1]], HIGH5[h[2]], HIGH5[h[3]]};
        memcpy(hi, t, Q32); /* hi[e]: element e's fifth bit, as 0 or 16 */
        for (int e = 0; e < Q32; e++) p->v[Q32 * b + e] = (signed char)((p->v[Q32 * b + e] | hi[e]) - 16);
    }
#endif
}

static NO_CONTRACT void q5_0_dequant(const unsigned char *blk, float *out) {
    const float d = half_at(blk);
    unsigned qh;
    memcpy(&qh, blk + 2, 4);
    for (int l = 0; l < 16; l++) {
        const int lo = (blk[6 + l] & 15) | ((qh >> l) & 1) << 4, hi = (blk[6 + l] >> 4) | ((qh >> (16 + l)) & 1) << 4;
        out[l] = d * (float)(lo - 16), out[16 + l] = d * (float)(hi - 16);
    }
}

static void q5_0_outputs(const struct acts32 *a, long r0, int R, const unsigned char *wo, float *y, long out) {
    b32_outputs(q5_0_decode, Q5_0_BYTES, B_OFF(16) != 0, 0, 0, a, r0, R, wo, y, out);
}

static void q5_0_matmul(const float *x, long rows, long in, const unsigned char *w, float *y, long out, int threads) {
    b32_matmul(q5_0_outputs, Q5_0_BYTES, B_OFF(16), 0, x, rows, in, w, y, out, threads);
}
