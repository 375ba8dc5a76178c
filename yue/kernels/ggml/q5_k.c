/* Q5_K (ggml type 13): super-blocks of 256 in 176 bytes: d, dmin (float16), Q4_K's 12 bytes of scales and
 * mins, 32 bytes of high bits (bit c of byte l: element 32 c + l), 128 bytes of low nibbles as Q4_K's.
 * Value: d sc q - dmin m, q 0..31. Uses q4_k.c's k_scales. */
#define Q5_K_BYTES 176

static inline __attribute__((always_inline)) void q5_k_decode(const unsigned char *blk, struct kblock *k) {
    k_scales(blk, k);
    const unsigned char *qh = blk + 16, *qs = blk + 48;
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            k->q[64 * c + l] = (qs[32 * c + l] & 15) | ((qh[l] >> (2 * c)) & 1) << 4;
            k->q[64 * c + 32 + l] = (qs[32 * c + l] >> 4) | ((qh[l] >> (2 * c + 1)) & 1) << 4;
        }
}

static NO_CONTRACT void q5_k_dequant(const unsigned char *blk, float *out) {
    struct kblock k;
    q5_k_decode(blk, &k);
    for (int e = 0; e < QK; e++) {
        const float ds = k.d * (float)k.sc[e / 16], dm = k.dm * (float)k.mn[e / 16];
        out[e] = ds * (float)k.q[e] - dm;
    }
}

static void q5_k_matmul(const float *x, long rows, long in, const unsigned char *w, float *y, long out, int threads) {
    k_matmul(q5_k_decode, Q5_K_BYTES, x, rows, in, w, y, out, threads);
}
