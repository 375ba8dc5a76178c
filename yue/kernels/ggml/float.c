/* F32 (ggml type 0), F16 (1), BF16 (30): rows of `in` plain values. Float FMAs on float32 (float16 and
 * bfloat16 widen to float32 exactly): output o of row r is LANES fmaf chains (lane i % LANES), added in
 * lanes_sum's fixed tree, then the inputs past the last whole vector: the same bits in every call. */

static inline __attribute__((always_inline)) long float_bytes(int type) { return type == GGML_F32 ? 4 : 2; }

/* Weight i of a row at p as a float. */
static inline __attribute__((always_inline)) float float_at(int type, const unsigned char *p, long i) {
    if (type == GGML_F32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    if (type == GGML_F16) return half_at(p + 2 * i);
    union {
        unsigned u;
        float f;
    } v = {.u = (unsigned)(p[2 * i] | p[2 * i + 1] << 8) << 16}; /* bfloat16: a float32's high half */
    return v.f;
}

/* Weights i..i + LANES of a row at p as floats. */
static inline __attribute__((always_inline)) vf float_load(int type, const unsigned char *p, long i) {
    vf v;
    if (type == GGML_F32) {
        memcpy(&v, p + 4 * i, sizeof v);
        return v;
    }
#if defined(__AVX512F__) && LANES == 16
    const __m256i h = _mm256_loadu_si256((const __m256i *)(p + 2 * i));
    if (type == GGML_F16) return (vf)_mm512_cvtph_ps(h);
    return (vf)_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
#elif defined(__AVX2__) && defined(__F16C__) && LANES == 8
    const __m128i h = _mm_loadu_si128((const __m128i *)(p + 2 * i));
    if (type == GGML_F16) return (vf)_mm256_cvtph_ps(h);
    return (vf)_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
#else
    for (int l = 0; l < LANES; l++) v[l] = float_at(type, p, i + l);
    return v;
#endif
}

/* Output o of R rows xp (rows of `in`), its row wr, into y (stride out): instantiated per type (f32_output,
 * ...) so that the loads inline with their type known (kquants.h's k_outputs says why). */
static inline __attribute__((always_inline)) void float_output(int type, const float *xp, long R, long in,
                                                               const unsigned char *wr, float *y, long out) {
    const long whole = in / LANES * LANES;
    vf acc[MAX_R] = {{0}};
    for (long i = 0; i < whole; i += LANES) {
        const vf wv = float_load(type, wr, i);
        for (long r = 0; r < R; r++) {
            vf xv;
            memcpy(&xv, xp + r * in + i, sizeof xv);
            acc[r] = vfma(wv, xv, acc[r]);
        }
    }
    for (long r = 0; r < R; r++) {
        float s = lanes_sum(acc[r]);
        for (long i = whole; i < in; i++) s = fmaf(float_at(type, wr, i), xp[r * in + i], s);
        y[r * out] = s;
    }
}

typedef void (*float_output_fn)(const float *, long, long, const unsigned char *, float *, long);
static void f32_output(const float *xp, long R, long in, const unsigned char *wr, float *y, long out) {
    float_output(GGML_F32, xp, R, in, wr, y, out);
}
static void f16_output(const float *xp, long R, long in, const unsigned char *wr, float *y, long out) {
    float_output(GGML_F16, xp, R, in, wr, y, out);
}
static void bf16_output(const float *xp, long R, long in, const unsigned char *wr, float *y, long out) {
    float_output(GGML_BF16, xp, R, in, wr, y, out);
}

static void float_matmul(int type, const float *x, long rows, long in, const unsigned char *w, float *y, long out,
                         int threads) {
    const float_output_fn output = type == GGML_F32 ? f32_output : type == GGML_F16 ? f16_output : bf16_output;
    const long row_bytes = in * float_bytes(type);
    for (long r0 = 0; r0 < rows; r0 += MAX_R) {
        const long R = rows - r0 < MAX_R ? rows - r0 : MAX_R;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
        for (long o = 0; o < out; o++) output(x + r0 * in, R, in, w + o * row_bytes, y + r0 * out + o, out);
    }
}

static void float_get_rows(int type, const unsigned char *w, long in, const long *ids, long n, float *out) {
    for (long i = 0; i < n; i++)
        for (long e = 0; e < in; e++) out[i * in + e] = float_at(type, w + ids[i] * in * float_bytes(type), e);
}
