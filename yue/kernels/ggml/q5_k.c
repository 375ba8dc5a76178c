/* Q5_K (ggml type 13): super-blocks of 256 in 176 bytes: d, dmin (float16), Q4_K's 12 bytes of scales and
 * mins, 32 bytes of high bits (bit i of byte l: element 32 i + l), 128 bytes of low nibbles as Q4_K's.
 * Value: d sc q - dmin m, q 0..31. Uses q4_k.c's k_scales and k_codes. */
#define Q5_K_BYTES 176

static inline __attribute__((always_inline)) void q5_k_decode(const unsigned char *blk, struct kblock *k) {
    k_scales(blk, k);
    k_codes(blk + 48, blk + 16, k->q);
}

static NO_CONTRACT void q5_k_dequant(const unsigned char *blk, float *out) {
    struct kblock k;
    q5_k_decode(blk, &k);
    k_dequant_mins32(&k, out);
}

static void q5_k_outputs(const struct acts *a, long r0, int R, long nb, const unsigned char *wo, float *y, long out) {
    k_outputs(q5_k_decode, Q5_K_BYTES, MINS32, a, r0, R, nb, wo, y, out);
}

static void q5_k_matmul(const float *x, long rows, long in, const unsigned char *w, float *y, long out, int threads) {
    k_matmul(q5_k_outputs, Q5_K_BYTES, MINS32, x, rows, in, w, y, out, threads);
}
