/* Q6_K (ggml type 14): super-blocks of 256 in 210 bytes: 128 bytes of low nibbles, 64 of high 2-bit pairs,
 * 16 int8 scales (one per 16 elements), d (float16). In half h (128 elements), element 128 h + 32 k + l
 * (k 0..3, l 0..31) has low nibble ql[64 h + 32 (k % 2) + l] (>> 4 for k >= 2) and high bits
 * qh[32 h + l] >> 2 k. Value: d sc (q - 32), q 0..63: kblock's form with mn = 32 sc, dm = d. */
#define Q6_K_BYTES 210

static inline __attribute__((always_inline)) void q6_k_decode(const unsigned char *blk, struct kblock *k) {
    const unsigned char *ql = blk, *qh = blk + 128;
    const signed char *sc = (const signed char *)(blk + 192);
    for (int h = 0; h < 2; h++)
        for (int kk = 0; kk < 4; kk++)
            for (int l = 0; l < 32; l++) {
                const unsigned char lo = ql[64 * h + 32 * (kk % 2) + l] >> (kk / 2 * 4) & 15;
                k->q[128 * h + 32 * kk + l] = lo | ((qh[32 * h + l] >> (2 * kk)) & 3) << 4;
            }
    for (int j = 0; j < 16; j++) k->sc[j] = sc[j], k->mn[j] = (short)(32 * sc[j]);
    k->d = k->dm = half_at(blk + 208);
    expand_scales(k->sc, k->scw);
}

/* (d sc) (q - 32), as gguf.quants dequantizes. */
static NO_CONTRACT void q6_k_dequant(const unsigned char *blk, float *out) {
    struct kblock k;
    q6_k_decode(blk, &k);
    for (int e = 0; e < QK; e++) out[e] = (k.d * (float)k.sc[e / 16]) * (float)(k.q[e] - 32);
}

static void q6_k_matmul(const float *x, long rows, long in, const unsigned char *w, float *y, long out, int threads) {
    k_matmul(q6_k_decode, Q6_K_BYTES, x, rows, in, w, y, out, threads);
}
