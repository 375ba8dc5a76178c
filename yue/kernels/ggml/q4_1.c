/* Q4_1 (ggml type 3): blocks of 32 in 20 bytes: d, m (float16), 16 bytes of 4-bit codes as Q4_0's.
 * Value: d q + m. */
#define Q4_1_BYTES 20

/* A pair of blocks (blocks32.h's struct pair32): the codes q, d and m; no C, the min term instead. */
static inline __attribute__((always_inline)) void q4_1_decode(const unsigned char *blk, int n, struct pair32 *p) {
    b_scales(blk, Q4_1_BYTES, 0, n, &p->d);
    b_scales(blk, Q4_1_BYTES, 2, n, &p->m);
    b_nibbles(blk, Q4_1_BYTES, 4, n, 0, p);
}

static NO_CONTRACT void q4_1_dequant(const unsigned char *blk, float *out) {
    const float d = half_at(blk), m = half_at(blk + 2);
    for (int l = 0; l < 16; l++)
        out[l] = d * (float)(blk[4 + l] & 15) + m, out[16 + l] = d * (float)(blk[4 + l] >> 4) + m;
}

static void q4_1_outputs(const struct acts32 *a, long r0, int R, const unsigned char *wo, float *y, long out) {
    b32_outputs(q4_1_decode, Q4_1_BYTES, 0, 0, 1, a, r0, R, wo, y, out);
}

static void q4_1_matmul(const float *x, long rows, long in, const unsigned char *w, float *y, long out, int threads) {
    b32_matmul(q4_1_outputs, Q4_1_BYTES, 0, 1, x, rows, in, w, y, out, threads);
}
