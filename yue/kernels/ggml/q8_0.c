/* Q8_0 (ggml type 8): blocks of 32 in 34 bytes: d (float16), 32 int8 codes. Value: d q. */
#define Q8_0_BYTES 34

static inline __attribute__((always_inline)) void q8_0_decode(const unsigned char *blk, struct block32 *k) {
    k->d = half_at(blk), k->m = 0.f;
    memcpy(k->sq, blk + 2, Q32);
    for (int e = 0; e < Q32; e++) k->q[e] = (unsigned char)(k->sq[e] < 0 ? -k->sq[e] : k->sq[e]); /* -128: 128 */
}

static NO_CONTRACT void q8_0_dequant(const unsigned char *blk, float *out) {
    struct block32 k;
    q8_0_decode(blk, &k);
    for (int e = 0; e < Q32; e++) out[e] = (float)k.sq[e] * k.d;
}

static void q8_0_outputs(const struct acts *a, long r0, int R, long nb, const unsigned char *wo, float *y, long out) {
    b32_outputs(q8_0_decode, Q8_0_BYTES, 0, 1, a, r0, R, nb, wo, y, out);
}

static void q8_0_matmul(const float *x, long rows, long in, const unsigned char *w, float *y, long out, int threads) {
    b32_matmul(q8_0_outputs, Q8_0_BYTES, x, rows, in, w, y, out, threads);
}
