/* Q5_0 (ggml type 6): blocks of 32 in 22 bytes: d (float16), 4 bytes of high bits (bit e of the
 * little-endian word: element e), 16 bytes of low nibbles as Q4_0's. Value: d (q - 16), q 0..31. */
#define Q5_0_BYTES 22

static inline __attribute__((always_inline)) void q5_0_decode(const unsigned char *blk, struct block32 *k) {
    k->d = half_at(blk), k->m = 0.f;
    const unsigned qh = blk[2] | blk[3] << 8 | blk[4] << 16 | (unsigned)blk[5] << 24;
    for (int l = 0; l < 16; l++) {
        k->sq[l] = (signed char)(((blk[6 + l] & 15) | ((qh >> l) & 1) << 4) - 16);
        k->sq[16 + l] = (signed char)(((blk[6 + l] >> 4) | ((qh >> (16 + l)) & 1) << 4) - 16);
    }
    for (int e = 0; e < Q32; e++) k->q[e] = (unsigned char)(k->sq[e] < 0 ? -k->sq[e] : k->sq[e]);
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
