/* Q4_1 (ggml type 3): blocks of 32 in 20 bytes: d, m (float16), 16 bytes of 4-bit codes as Q4_0's.
 * Value: d q + m. */
#define Q4_1_BYTES 20

static inline __attribute__((always_inline)) void q4_1_decode(const unsigned char *blk, struct block32 *k) {
    k->d = half_at(blk), k->m = half_at(blk + 2);
    for (int l = 0; l < 16; l++) k->q[l] = blk[4 + l] & 15, k->q[16 + l] = blk[4 + l] >> 4;
}

static NO_CONTRACT void q4_1_dequant(const unsigned char *blk, float *out) {
    struct block32 k;
    q4_1_decode(blk, &k);
    for (int e = 0; e < Q32; e++) out[e] = k.d * (float)k.q[e] + k.m;
}

static void q4_1_outputs(const struct acts *a, long r0, int R, long nb, const unsigned char *wo, float *y, long out) {
    b32_outputs(q4_1_decode, Q4_1_BYTES, 1, 0, a, r0, R, nb, wo, y, out);
}

static void q4_1_matmul(const float *x, long rows, long in, const unsigned char *w, float *y, long out, int threads) {
    b32_matmul(q4_1_outputs, Q4_1_BYTES, x, rows, in, w, y, out, threads);
}
