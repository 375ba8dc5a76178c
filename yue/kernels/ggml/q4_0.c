/* Q4_0 (ggml type 2): blocks of 32 in 18 bytes: d (float16), 16 bytes of 4-bit codes (byte l: element l in
 * its low nibble, 16 + l in its high one). Value: d (q - 8). */
#define Q4_0_BYTES 18

static inline __attribute__((always_inline)) void q4_0_decode(const unsigned char *blk, struct block32 *k) {
    k->d = half_at(blk), k->m = 0.f;
    for (int l = 0; l < 16; l++) k->sq[l] = (signed char)((blk[2 + l] & 15) - 8), k->sq[16 + l] = (signed char)((blk[2 + l] >> 4) - 8);
    for (int e = 0; e < Q32; e++) k->q[e] = (unsigned char)(k->sq[e] < 0 ? -k->sq[e] : k->sq[e]);
}

static NO_CONTRACT void q4_0_dequant(const unsigned char *blk, float *out) {
    struct block32 k;
    q4_0_decode(blk, &k);
    for (int e = 0; e < Q32; e++) out[e] = k.d * (float)k.sq[e];
}

static void q4_0_outputs(const struct acts *a, long r0, int R, long nb, const unsigned char *wo, float *y, long out) {
    b32_outputs(q4_0_decode, Q4_0_BYTES, 0, 1, a, r0, R, nb, wo, y, out);
}

static void q4_0_matmul(const float *x, long rows, long in, const unsigned char *w, float *y, long out, int threads) {
    b32_matmul(q4_0_outputs, Q4_0_BYTES, x, rows, in, w, y, out, threads);
}
