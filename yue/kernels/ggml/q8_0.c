/* Q8_0 (ggml type 8): blocks of 32 in 34 bytes: d (float16), 32 int8 codes. Value: d q. */
#define Q8_0_BYTES 34

/* With dpbusd the codes are taken unsigned, q + 128 (C is -128 sum x); without it, |q| against x with q's
 * signs (Q8_0_SIGN), since maddubs' pairs of 255 x 127 would saturate. */
#if defined(B_DPBUSD) || !defined(B_SIMD)
#define Q8_0_SIGN 0
#else
#define Q8_0_SIGN 1
#endif

/* A pair of blocks (blocks32.h's struct pair32). */
static inline __attribute__((always_inline)) void q8_0_decode(const unsigned char *blk, int n, struct pair32 *p) {
    b_scales(blk, Q8_0_BYTES, 0, n, &p->d);
#if defined(B_AVX512)
    const __m256i w0 = _mm256_loadu_si256((const __m256i *)(blk + 2));
    const __m256i w1 = n == 2 ? _mm256_loadu_si256((const __m256i *)(blk + Q8_0_BYTES + 2)) : _mm256_setzero_si256();
    const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(w0), w1, 1);
#if defined(B_DPBUSD)
    p->u = _mm512_xor_si512(w, _mm512_set1_epi8((char)0x80));
#else
    p->u = _mm512_abs_epi8(w), p->neg = _mm512_movepi8_mask(w); /* |-128| is 128 as an unsigned byte */
#endif
#elif defined(B_AVX2)
    for (int b = 0; b < n; b++) {
        const __m256i w = _mm256_loadu_si256((const __m256i *)(blk + b * Q8_0_BYTES + 2));
#if defined(B_DPBUSD)
        p->u[b] = _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80));
#else
        p->u[b] = _mm256_abs_epi8(w), p->v[b] = w;
#endif
    }
#else
    for (int b = 0; b < n; b++) memcpy(p->v + Q32 * b, blk + b * Q8_0_BYTES + 2, Q32);
#endif
}

static NO_CONTRACT void q8_0_dequant(const unsigned char *blk, float *out) {
    const float d = half_at(blk);
    for (int e = 0; e < Q32; e++) out[e] = (float)(signed char)blk[2 + e] * d;
}

static void q8_0_outputs(const struct acts32 *a, long r0, int R, const unsigned char *wo, float *y, long out) {
    b32_outputs(q8_0_decode, Q8_0_BYTES, !Q8_0_SIGN && B_OFF(128) != 0, Q8_0_SIGN, 0, a, r0, R, wo, y, out);
}

static void q8_0_matmul(const float *x, long rows, long in, const unsigned char *w, float *y, long out, int threads) {
    b32_matmul(q8_0_outputs, Q8_0_BYTES, Q8_0_SIGN ? 0 : B_OFF(128), 0, x, rows, in, w, y, out, threads);
}
