/* Q4_K (ggml type 12): super-blocks of 256 in 144 bytes: d, dmin (float16), 12 bytes of 6-bit scales and
 * mins for the 8 groups of 32, then 128 bytes of 4-bit codes (byte 32 c + l: element 64 c + l in its low
 * nibble, 64 c + 32 + l in its high one). Value: d sc q - dmin m. */
#define Q4_K_BYTES 144

/* The 6-bit scale and min of group j (0..7) from the 12 packed bytes (gguf's Q4_K.get_scale_min). */
static inline void k_scale_min(const unsigned char *s, int j, short *sc, short *mn) {
    if (j < 4)
        *sc = s[j] & 63, *mn = s[j + 4] & 63;
    else
        *sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4, *mn = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
}

/* The scales of a Q4_K / Q5_K super-block, per 16 (each group of 32's twice). */
static inline void k_scales(const unsigned char *blk, struct kblock *k) {
    k->d = half_at(blk), k->dm = half_at(blk + 2);
    for (int j = 0; j < 8; j++) {
        k_scale_min(blk + 4, j, &k->sc[2 * j], &k->mn[2 * j]);
        k->sc[2 * j + 1] = k->sc[2 * j], k->mn[2 * j + 1] = k->mn[2 * j];
    }
    expand_scales(k->sc, k->scw);
}

static inline __attribute__((always_inline)) void q4_k_decode(const unsigned char *blk, struct kblock *k) {
    k_scales(blk, k);
    const unsigned char *qs = blk + 16;
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) k->q[64 * c + l] = qs[32 * c + l] & 15, k->q[64 * c + 32 + l] = qs[32 * c + l] >> 4;
}

/* (d sc) q - (dmin m), as gguf.quants dequantizes. */
static NO_CONTRACT void q4_k_dequant(const unsigned char *blk, float *out) {
    struct kblock k;
    q4_k_decode(blk, &k);
    for (int e = 0; e < QK; e++) {
        const float ds = k.d * (float)k.sc[e / 16], dm = k.dm * (float)k.mn[e / 16];
        out[e] = ds * (float)k.q[e] - dm;
    }
}

static void q4_k_matmul(const float *x, long rows, long in, const unsigned char *w, float *y, long out, int threads) {
    k_matmul(q4_k_decode, Q4_K_BYTES, x, rows, in, w, y, out, threads);
}
