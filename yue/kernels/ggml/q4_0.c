/* Q4_0 (ggml type 2): blocks of 32 in 18 bytes: d (float16), 16 bytes of 4-bit codes (byte l: element l in
 * its low nibble, 16 + l in its high one). Value: d (q - 8). */
#define Q4_0_BYTES 18

/* A pair of blocks (blocks32.h's struct pair32): codes q (vectors), q - 8 (plain); C is -8 sum x. */
static inline __attribute__((always_inline)) void q4_0_decode(const unsigned char *blk, int n, struct pair32 *p) {
    b_scales(blk, Q4_0_BYTES, 0, n, &p->d);
    b_nibbles(blk, Q4_0_BYTES, 2, n, 8, p);
}

static NO_CONTRACT void q4_0_dequant(const unsigned char *blk, float *out) {
    const float d = half_at(blk);
    for (int l = 0; l < 16; l++)
        out[l] = d * (float)((blk[2 + l] & 15) - 8), out[16 + l] = d * (float)((blk[2 + l] >> 4) - 8);
}

static void q4_0_outputs(const struct acts32 *a, long r0, int R, const unsigned char *wo, float *y, long out) {
    b32_outputs(q4_0_decode, Q4_0_BYTES, B_OFF(8) != 0, 0, 0, a, r0, R, wo, y, out);
}

static void q4_0_matmul(const float *x, long rows, long in, const unsigned char *w, float *y, long out, int threads) {
    b32_matmul(q4_0_outputs, Q4_0_BYTES, B_OFF(8), 0, x, rows, in, w, y, out, threads);
}
