/* yue's row kernels (yue/kernels/rowkernel.py): float32 decode-step work over a few rows, each row's bits
 * independent of the call. First the matmul; below it RMSNorm, attention and a whole layer in one call.
 *
 * A float32 matmul over a few rows that streams the weight once: y (rows, out) = x (rows, in) @ W.t().
 *
 * Why (docs/design.md §10; the measurements in docs/results-log.md): on a CPU a verifying step's 2-9
 * rows should cost about what one row does, since the weights' bytes, not the arithmetic, bound a
 * decode step. MKL's small-M GEMM re-packs the weight on every call and oneDNN's pre-packed GEMM
 * streams it slower than MKL's one-row GEMV, so each extra row cost a large share of a step; this loop
 * reads every weight once for all rows, keeping their sums in registers, and for one row streams
 * faster than MKL's GEMV.
 *
 * Layout (rowkernel.block): W (out, in) as column blocks of BLK outputs, (ceil(out / BLK), in, BLK),
 * zero-padded; each block is one contiguous stream, read input by input, several blocks at once.
 *
 * Exactness: y[r][o] is one fmaf chain over the inputs in order, whatever the row count, the row's
 * place in the call or the thread count (a block is one thread's), so a row's result is the same bits
 * in every call (the tests check it).
 */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define BLK 32       /* outputs per column block: two AVX512 vectors, four AVX2 ones */
#define MAX_R 9      /* rows per pass: a verifying step's k + 1 with k = 8 drafts */
#define PREFETCH 256 /* floats ahead (8 inputs of a block) that each stream is prefetched */
/* Every weight prefetch here asks for all cache levels (locality 3). Non-temporal ones (locality 0), as
 * these kernels had, kept a model that fits the last-level cache (yue-code-mini's) from staying there
 * and left a one-row step at a fraction of the memory's speed (docs/results-log.md, 2026-12-07). */

/* NB adjacent column blocks from block b for R rows: the R x NB x BLK sums stay in registers for the
 * whole input loop, and the NB blocks are NB concurrent memory streams. One stream leaves the memory
 * system idle: each stream added up to four made a row faster, and four beat MKL's GEMV (timings:
 * docs/results-log.md). More rows need more sums, so fewer streams (`STREAMS`). */
#define BLOCKS_FN(NAME, R, NB)                                                                              \
    static void NAME(const float *x, long in, const float *w, float *y, long out, long b) {                 \
        float acc[R][NB][BLK];                                                                              \
        for (int r = 0; r < R; r++)                                                                         \
            for (int k = 0; k < NB; k++)                                                                    \
                for (int j = 0; j < BLK; j++) acc[r][k][j] = 0.f;                                           \
        for (long i = 0; i < in; i++) {                                                                     \
            for (int k = 0; k < NB; k++) {                                                                  \
                const float *wi = w + k * in * BLK + i * BLK;                                               \
                __builtin_prefetch(wi + PREFETCH, 0, 3);                                                    \
                __builtin_prefetch(wi + PREFETCH + 16, 0, 3);                                               \
                for (int r = 0; r < R; r++) {                                                               \
                    const float xr = x[r * in + i];                                                         \
                    for (int j = 0; j < BLK; j++) acc[r][k][j] = fmaf(xr, wi[j], acc[r][k][j]);             \
                }                                                                                           \
            }                                                                                               \
        }                                                                                                   \
        for (int k = 0; k < NB; k++) {                                                                      \
            long n = out - (b + k) * BLK < BLK ? out - (b + k) * BLK : BLK; /* a partial last block */      \
            for (int r = 0; r < R; r++)                                                                     \
                for (long j = 0; j < n; j++) y[r * out + (b + k) * BLK + j] = acc[r][k][j];                 \
        }                                                                                                   \
    }

/* Blocks per call by rows (the NB of each block_R below), and one-block functions for the blocks left
 * over when a matmul's count is not a multiple of NB. With AVX512's 32 vector registers more streams
 * pay than the register count suggests (the sums that do not fit stay in L1), measured on SmolLM2's
 * layers against the other table; compiled for AVX2's 16 registers the two tables measured alike, and
 * on an AVX2 CPU 6 rows spill with two streams, so one streams them. 8 and 9 rows take one stream in
 * every build: two (32 and 36 vectors of sums) were slower, from memory and from a cache alike
 * (timings: docs/results-log.md). Each output's sum runs over the inputs in order whatever NB: the
 * same bits. */
#if defined(__AVX512F__)
#define NB_3 4
#define NB_5 3
#define NB_6 3
#define NB_7 2
#else
#define NB_3 3
#define NB_5 2
#define NB_6 1
#define NB_7 1
#endif
#define NB_8 1
static const int STREAMS[MAX_R + 1] = {0, 4, 4, NB_3, NB_3, NB_5, NB_6, NB_7, NB_8, NB_8};
BLOCKS_FN(block_1, 1, 4)
BLOCKS_FN(block_2, 2, 4)
BLOCKS_FN(block_3, 3, NB_3)
BLOCKS_FN(block_4, 4, NB_3)
BLOCKS_FN(block_5, 5, NB_5)
BLOCKS_FN(block_6, 6, NB_6)
BLOCKS_FN(block_7, 7, NB_7)
BLOCKS_FN(block_8, 8, NB_8)
BLOCKS_FN(block_9, 9, NB_8)
BLOCKS_FN(single_1, 1, 1)
BLOCKS_FN(single_2, 2, 1)
BLOCKS_FN(single_3, 3, 1)
BLOCKS_FN(single_4, 4, 1)
BLOCKS_FN(single_5, 5, 1)
BLOCKS_FN(single_6, 6, 1)
BLOCKS_FN(single_7, 7, 1)
BLOCKS_FN(single_8, 8, 1)
BLOCKS_FN(single_9, 9, 1)

typedef void (*block_fn)(const float *, long, const float *, float *, long, long);
static const block_fn BLOCKS[MAX_R + 1] = {0, block_1, block_2, block_3, block_4,
                                           block_5, block_6, block_7, block_8, block_9};
static const block_fn SINGLES[MAX_R + 1] = {0, single_1, single_2, single_3, single_4,
                                            single_5, single_6, single_7, single_8, single_9};

/* A matmul's passes over its block functions: rows beyond MAXR take further passes; groups of column
 * blocks are shared among `threads` OpenMP threads where built with it. */
#define MATMUL_PASSES(BLOCKS, SINGLES, STREAMS, MAXR, BLOCK_SIZE)                                           \
    const long blocks = (out + BLK - 1) / BLK, bs = (BLOCK_SIZE); /* a column block's weight elements */   \
    for (long r0 = 0; r0 < rows; r0 += MAXR) {                                                              \
        const long R = rows - r0 < MAXR ? rows - r0 : MAXR;                                                 \
        const long nb = STREAMS[R], groups = blocks / nb;                                                   \
        const float *xr = x + r0 * in;                                                                      \
        float *yr = y + r0 * out;                                                                           \
        _Pragma("omp parallel for num_threads(threads) schedule(static) if (threads > 1)")                 \
        for (long g = 0; g < groups; g++) BLOCKS[R](xr, in, w + g * nb * bs, yr, out, g * nb);              \
        for (long b = groups * nb; b < blocks; b++) SINGLES[R](xr, in, w + b * bs, yr, out, b);             \
    }

/* x: (rows, in) row-major; w: rowkernel.block's layout; y: (rows, out) row-major. */
void rows_matmul(const float *x, long rows, long in, const float *w, float *y, long out, int threads) {
    MATMUL_PASSES(BLOCKS, SINGLES, STREAMS, MAX_R, in * BLK)
}

int rows_block(void) { return BLK; }

/* ---- The rest of a float32 decode step's row-wise work, row-exact the same way ----
 *
 * Why: with the matmuls streamed at memory speed, the step's other calls (torch's RMSNorm, 60 calls a
 * step; the exact form's padded SDPA) became a large share of it (docs/results-log.md). */

/* Partial sums of a dot product: one native vector (AVX512's 16 floats; 8 elsewhere, one AVX2 vector,
 * two SSE or NEON ones). The bits of a result depend on it, so they are the same within one build. */
#if defined(YUE_LANES) /* a test's plain build at another width (-DYUE_LANES=16: AVX512's layout) */
#define LANES YUE_LANES
#elif defined(__AVX512F__)
#define LANES 16
#else
#define LANES 8
#endif

/* LANES floats as one value (GCC/Clang vector extensions: one AVX512 or AVX2 register, two SSE or NEON
 * ones), loaded from any float address; vi the same bits as ints. */
typedef float vf __attribute__((vector_size(LANES * sizeof(float)), aligned(sizeof(float))));
typedef int vi __attribute__((vector_size(LANES * sizeof(int)), aligned(sizeof(int))));

/* The LANES lanes added in a fixed tree. */
static inline __attribute__((always_inline)) float lanes_sum(vf acc) {
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    return acc[0];
}

/* sum_i a[i] * b[i] as LANES chains (lane i % LANES) added in a fixed tree: the same bits in every call. */
static inline __attribute__((always_inline)) float dot(const float *a, const float *b, long n) {
    vf acc = {0};
    long i = 0;
    for (; i + LANES <= n; i += LANES) acc += *(const vf *)(a + i) * *(const vf *)(b + i);
    for (int l = 0; i < n; i++, l++) acc[l] += a[i] * b[i];
    return lanes_sum(acc);
}

/* exp(x) for x <= 0 (softmax's shifted scores), LANES at a time: 2^n * p(r) with n = round(x / ln 2),
 * r = x - n ln 2 (Cody-Waite, two parts), p a degree-6 Taylor polynomial (|r| <= ln 2 / 2: relative
 * error ~2e-7, about libm's expf); 0 below -87 (where expf goes subnormal) and for -inf. */
static inline __attribute__((always_inline)) vf exp_neg(vf x) {
    const vf magic = (vf){0} + 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    const vf t = x * 1.44269504f + magic;
    const vf n = t - magic;
    const vf r = (x - n * 0.693145752f) - n * 1.42860677e-6f;
    vf p = (vf){0} + 1.f / 720;
    p = p * r + 1.f / 120;
    p = p * r + 1.f / 24;
    p = p * r + 1.f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.f;
    p = p * r + 1.f;
    const vi scale = ((vi)t - (vi)magic + 127) << 23; /* 2^n as a float's bits */
    return (vf)((vi)(p * (vf)scale) & (x >= -87.0f));
}

/* out = act(g) * u over n values, act silu (`gelu` 0: g * sigmoid(g)) or GELU's tanh form (`gelu` 1:
 * 0.5 g (1 + tanh(y)), y = sqrt(2 / pi) (g + 0.044715 g^3), torch's `gelu(approximate="tanh")`, Gemma's
 * GeGLU). Both are z * s(2 a), s the logistic function and (z, a) = (g, g / 2) or (g, y): s from
 * e = exp(-2 |a|) (exp_neg, LANES at a time; 1 / (1 + e) for a >= 0, e / (1 + e) below), so no exp
 * overflows and 1 + tanh(y) keeps its precision where it is near 0. A value's bits depend on its index
 * in the row only (the tail past the last whole vector goes through expf / tanhf), never on the rows of
 * the call. Why: libm's expf, one value at a time (30 layers x 1,536 values a SmolLM2 row), was a
 * measurable share of a one-row step (docs/results-log.md). */
static void act_mul(const float *g, const float *u, float *out, long n, int gelu) {
    const vi sign = (vi){0} + (int)0x80000000;
    const float beta = 0.7978845608028654f, kappa = 0.044715f; /* sqrt(2 / pi), as torch's kBeta */
    long i = 0;
    for (; i + LANES <= n; i += LANES) {
        const vf gv = *(const vf *)(g + i);
        const vf a = gelu ? beta * (gv + kappa * (gv * gv * gv)) : gv * 0.5f;
        const vi neg = a < 0.f;
        const vf e = exp_neg((vf)((vi)(a + a) | sign)); /* exp(-2 |a|) */
        const vf one = (vf){0} + 1.f;
        const vf num = (vf)(((vi)e & neg) | ((vi)one & ~neg));
        *(vf *)(out + i) = gv * (num / (one + e)) * *(const vf *)(u + i);
    }
    for (; i < n; i++) {
        const float y = beta * (g[i] + kappa * (g[i] * g[i] * g[i]));
        out[i] = (gelu ? 0.5f * g[i] * (1.f + tanhf(y)) : g[i] / (1.f + expf(-g[i]))) * u[i];
    }
}

/* y = x / sqrt(mean(x^2) + eps) * weight over each of `rows` rows of n (row-major). */
void rows_rms_norm(const float *x, long rows, long n, const float *weight, float eps, float *y) {
    for (long r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        const float scale = 1.0f / sqrtf(dot(xr, xr, n) / (float)n + eps);
        for (long i = 0; i < n; i++) yr[i] = weight[i] * (xr[i] * scale);
    }
}

/* out (rows, V) = `fill` everywhere but at ids (Vd of them, each < V, distinct), where row r holds
 * sub (rows, Vd): a reduced drafting vocabulary's logits spread over the whole vocabulary in one pass
 * (torch's fill then scatter_ was a measurable share of a drafting pass: docs/results-log.md). */
void rows_spread(const float *sub, long rows, long Vd, const long *ids, long V, float fill, float *out) {
    for (long r = 0; r < rows; r++) {
        float *o = out + r * V;
        for (long j = 0; j < V; j++) o[j] = fill;
        for (long j = 0; j < Vd; j++) o[ids[j]] = sub[r * Vd + j];
    }
}

/* Per row of logits x (rows, V): its softmax's largest probability and its entropy (nats), for the
 * router's features (yue/model/router.py): m = max x, s = sum e^(x - m), t = sum e^(x - m) (x - m);
 * max probability 1 / s, entropy log s - t / s. Two passes over the row, LANES exps at a time, instead of
 * torch's log_softmax, exp and sum over a whole copy (dearer over SmolLM2's 49,152 logits: its timing in
 * docs/results-log.md). Logits of -inf (or below m - 87) weigh 0. */
static void softmax_row(const float *xr, long V, float *max_prob, float *entropy) {
    float m = -INFINITY;
    for (long j = 0; j < V; j++) m = xr[j] > m ? xr[j] : m;
    vf s = {0}, t = {0};
    long j = 0;
    for (; j + LANES <= V; j += LANES) {
        vf d = *(const vf *)(xr + j) - m;
        const vi near = d > -88.0f; /* -inf and far tails: weight 0, and d -88, not 0 * -inf */
        d = (vf)(((vi)d & near) | ((vi)((vf){0} - 88.0f) & ~near));
        const vf w = exp_neg(d);
        s += w, t += w * d;
    }
    float ss = lanes_sum(s), tt = lanes_sum(t);
    for (; j < V; j++) {
        const float d = xr[j] - m > -88.0f ? xr[j] - m : -88.0f;
        const float w = d > -87.0f ? expf(d) : 0.f;
        ss += w, tt += w * d;
    }
    *max_prob = 1.0f / ss;
    *entropy = logf(ss) - tt / ss;
}

void rows_softmax_stats(const float *x, long rows, long V, float *max_prob, float *entropy) {
    for (long r = 0; r < rows; r++) softmax_row(x + r * V, V, max_prob + r, entropy + r);
}

/* The LANES dot products of q (Dh) with the LANES rows of k (LANES, Dh), Dh % LANES == 0: each a
 * LANES-lane sum reduced in `lanes_sum`'s tree, all at once (shuffles put lane halves, then quarters,
 * ... of two keys' sums side by side), so a key's score has the same bits here as from `dot`. */
/* __builtin_shufflevector (GCC 12+, Clang); without it (or with -DYUE_NO_SHUFFLE, as a test builds)
 * scores go key by key through `dot`: the same bits, slower. */
#if !defined(YUE_NO_SHUFFLE) && (defined(__clang__) || __GNUC__ >= 12)
#define HAVE_SHUFFLE 1
#define SHUF __builtin_shufflevector
static inline __attribute__((always_inline)) vf dots(const vf *qv, int chunks, const float *k, long Dh) {
    vf a[LANES];
    _Pragma("GCC unroll 16") for (int j = 0; j < LANES; j++) {
        vf acc = {0};
        _Pragma("GCC unroll 16") for (int ch = 0; ch < chunks; ch++) acc += qv[ch] * *(const vf *)(k + j * Dh + ch * LANES);
        a[j] = acc;
    }
#if LANES == 16
    vf b[8], c[4], d[2];
    _Pragma("GCC unroll 16") for (int j = 0; j < 8; j++) /* lanes l + 8: keys 2j, 2j + 1 in lanes 0-7, 8-15 */
        b[j] = SHUF(a[2 * j], a[2 * j + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
               SHUF(a[2 * j], a[2 * j + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    _Pragma("GCC unroll 16") for (int j = 0; j < 4; j++) /* + 4: four keys, four lanes each */
        c[j] = SHUF(b[2 * j], b[2 * j + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
               SHUF(b[2 * j], b[2 * j + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    _Pragma("GCC unroll 16") for (int j = 0; j < 2; j++) /* + 2 */
        d[j] = SHUF(c[2 * j], c[2 * j + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
               SHUF(c[2 * j], c[2 * j + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
    return SHUF(d[0], d[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) + /* + 1 */
           SHUF(d[0], d[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
#else
    vf c[4], d[2];
    _Pragma("GCC unroll 16") for (int j = 0; j < 4; j++) /* lanes l + 4: keys 2j, 2j + 1 in lanes 0-3, 4-7 */
        c[j] = SHUF(a[2 * j], a[2 * j + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
               SHUF(a[2 * j], a[2 * j + 1], 4, 5, 6, 7, 12, 13, 14, 15);
    _Pragma("GCC unroll 16") for (int j = 0; j < 2; j++) /* + 2 */
        d[j] = SHUF(c[2 * j], c[2 * j + 1], 0, 1, 4, 5, 8, 9, 12, 13) +
               SHUF(c[2 * j], c[2 * j + 1], 2, 3, 6, 7, 10, 11, 14, 15);
    return SHUF(d[0], d[1], 0, 2, 4, 6, 8, 10, 12, 14) + SHUF(d[0], d[1], 1, 3, 5, 7, 9, 11, 13, 15);
#endif
}
#endif

/* Queries that read one kv head, taken together (up to ATT_QUERIES: a verifying step's rows times the
 * query heads that share the kv head): each block of keys is read once for all of them from L1, and
 * their value sums run side by side. Each query's arithmetic is unchanged: its scores key by key, its
 * values summed in key order, so its bits are those it has alone. `chunks` (Dh / LANES) is a constant
 * where rows_attention calls this for a common head size, so the loops over it unroll into registers. */
#define ATT_QUERIES 16
/* GCC contracts a * b + c into one FMA where it likes (-ffp-contract=fast), and it did so differently for
 * a key's score from `dots` and from `dot` in this loop on AVX2 (a query behind holes lost its solo bits:
 * tests/test_rowkernel.py). The attention takes no contraction: each product and sum rounded, alike in
 * every path. Clang contracts only within an expression, the same in both. */
#if defined(__clang__)
#define ATT_EXACT
#else
#define ATT_EXACT __attribute__((optimize("fp-contract=off")))
#endif
#define ATT_SUMS 4 /* queries whose value sums are taken together: 4 x ATT_SUMS chains of FMAs */

static inline __attribute__((always_inline)) ATT_EXACT void att_group(
    const float *const *qrs, const unsigned char *const *ms, const long *keys, long nq, const float *kr,
    const float *vr, float *const *outs, float *ps, long stride, float *seen_w, int Dh, const int chunks,
    float scale) {
    long most = 0;
    for (long i = 0; i < nq; i++) most = keys[i] > most ? keys[i] : most;
    /* Scores: a block of LANES keys at a time for every query (`dots`), a query's last partial block
     * key by key (`dot`): the same bits either way. */
    for (long j = 0; j < most; j += LANES)
        for (long i = 0; i < nq; i++) {
            float *p = ps + i * stride;
            if (j >= keys[i]) continue;
#ifdef HAVE_SHUFFLE
            if (j + LANES <= keys[i]) {
                vf qv[256 / LANES];
                for (int ch = 0; ch < chunks; ch++) qv[ch] = *(const vf *)(qrs[i] + ch * LANES);
                *(vf *)(p + j) = dots(qv, chunks, kr + j * Dh, Dh) * scale;
                continue;
            }
#endif
            for (long jj = j; jj < keys[i] && jj < j + LANES; jj++) p[jj] = dot(qrs[i], kr + jj * Dh, Dh) * scale;
        }
    float totals[ATT_QUERIES];
    for (long i = 0; i < nq; i++) { /* each query's softmax weights (unnormalised) and their sum */
        float *p = ps + i * stride;
        const unsigned char *m = ms[i];
        const long n = keys[i];
        float best = -INFINITY;
        if (m) {
            for (long j = 0; j < n; j++) {
                if (!m[j]) p[j] = -INFINITY;
                best = p[j] > best ? p[j] : best;
            }
        } else { /* the maximum, whatever the order it is taken in */
            long j = 0;
            vf most_v = (vf){0} - INFINITY;
            for (; j + LANES <= n; j += LANES) {
                const vf x = *(const vf *)(p + j);
                const vi up = x > most_v; /* NaN never: as the scalar test below */
                most_v = (vf)(((vi)x & up) | ((vi)most_v & ~up));
            }
            for (int l = 0; l < LANES; l++) best = most_v[l] > best ? most_v[l] : best;
            for (; j < n; j++) best = p[j] > best ? p[j] : best;
        }
        for (long j = 0; j < n; j += LANES) { /* the tail's lanes read past `n`: dropped */
            vf w = exp_neg(*(vf *)(p + j) - best);
            for (long l = n - j; l < LANES; l++) w[l] = 0.f;
            *(vf *)(p + j) = w;
        }
        /* The weights summed over the keys the query sees, each in the lane of its rank among them, not
         * of its index: a batch row whose keys sit behind holes (`KVCache.join`) sums as it would
         * alone, its keys from 0 with none hidden, so its bits are its solo bits. Without a mask every
         * key is seen, in order: p itself (its tail lanes zeroed above). */
        const float *ws = p;
        long seen = n;
        if (m) {
            seen = 0;
            for (long j = 0; j < n; j++)
                if (m[j]) seen_w[seen++] = p[j];
            for (long l = 0; l < LANES; l++) seen_w[seen + l] = 0.f;
            ws = seen_w;
        }
        vf sums = {0};
        for (long j = 0; j < seen; j += LANES) sums += *(const vf *)(ws + j);
        totals[i] = lanes_sum(sums); /* > 0: the best key's weight is 1; NaN if it saw none */
    }
    /* Values: ATT_SUMS queries at a time, each query's sums in key order; a key a query does not see
     * (weight 0) is skipped, as its values may be a hole's. */
    for (long i0 = 0; i0 < nq; i0 += ATT_SUMS) {
        const float *p[ATT_SUMS];
        long n[ATT_SUMS], far = 0;
        for (int r = 0; r < ATT_SUMS; r++) { /* past the group's queries: no keys */
            n[r] = i0 + r < nq ? keys[i0 + r] : 0;
            p[r] = ps + (i0 + r < nq ? i0 + r : i0) * stride;
            far = n[r] > far ? n[r] : far;
        }
        for (int c0 = 0; c0 < chunks; c0 += 4) { /* four vectors of each query's sums per pass */
            const int nc = chunks - c0 < 4 ? chunks - c0 : 4;
            vf acc[ATT_SUMS][4] = {{{0}}};
            for (long j = 0; j < far; j++) {
                const float *vj = vr + j * Dh + c0 * LANES;
                _Pragma("GCC unroll 4") for (int r = 0; r < ATT_SUMS; r++) {
                    if (j >= n[r] || p[r][j] == 0.f) continue;
                    _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++)
                        if (c < nc) acc[r][c] += p[r][j] * *(const vf *)(vj + c * LANES);
                }
            }
            for (int r = 0; r < ATT_SUMS && i0 + r < nq; r++)
                for (int c = 0; c < nc; c++) *(vf *)(outs[i0 + r] + (c0 + c) * LANES) = acc[r][c] / totals[i0 + r];
        }
    }
}

/* Attention of T queries over a KV cache, each (batch, head, query) on its own: softmax(q.k * scale)
 * over the keys the query may see, then the weighted sum of their values in key order. A key the query
 * may not see gets weight 0 and is skipped, so a query's bits depend only on the keys it sees, never on
 * the other queries of the call: a verifying step's row equals the one-row step it stands for.
 *
 * q: (B, H, T, Dh) at strides (qb, qh, qt) floats, Dh contiguous; k, v: (B, Hkv, S >= start + T, Dh)
 * at strides (kb, kh, Dh); query head h reads kv head h / (H / Hkv). visible: (B, T, start + T) bytes at
 * strides (mb, mt), 1 = may attend (mb = 0 for one mask shared by the batch), or NULL: query t sees keys
 * [0, start + t]. o: (B, T, H, Dh) contiguous, the layout the output projection reads. Dh a multiple of
 * LANES up to 256 (`rowkernel.attention` checks). */
ATT_EXACT void rows_attention(const float *q, long qb, long qh, long qt, const float *k, const float *v, long kb,
                    long kh, const unsigned char *visible, long mb, long mt, float *o, int B, int H,
                    int Hkv, int T, int Dh, long start, float scale, int threads) {
    const long S = start + T, per = (long)(H / Hkv) * T; /* the queries that read one kv head */
    const long parts = (per + ATT_QUERIES - 1) / ATT_QUERIES, items = (long)B * Hkv * parts;
    const int chunks = Dh / LANES;
#pragma omp parallel num_threads(threads) if (threads > 1 && items > 1)
    {
        float *ps = malloc(ATT_QUERIES * (S + LANES) * sizeof(float)); /* per query: scores, then weights */
        float *seen_w = malloc((S + LANES) * sizeof(float)); /* the weights of the keys a query sees, in order */
#pragma omp for schedule(static)
        for (long item = 0; item < items; item++) {
            const int b = item / (Hkv * parts), g = item / parts % Hkv;
            const long q0 = item % parts * ATT_QUERIES, nq = per - q0 < ATT_QUERIES ? per - q0 : ATT_QUERIES;
            const float *qrs[ATT_QUERIES];
            const unsigned char *ms[ATT_QUERIES];
            float *outs[ATT_QUERIES];
            long keys[ATT_QUERIES];
            for (long i = 0; i < nq; i++) { /* query i: head g (H / Hkv) + (q0 + i) / T, row (q0 + i) % T */
                const long h = g * (H / Hkv) + (q0 + i) / T, t = (q0 + i) % T;
                qrs[i] = q + b * qb + h * qh + t * qt;
                ms[i] = visible ? visible + b * mb + t * mt : NULL;
                keys[i] = ms[i] ? S : start + t + 1;
                outs[i] = o + (((long)b * T + t) * H + h) * Dh;
            }
            const float *kr = k + b * kb + g * kh, *vr = v + b * kb + g * kh;
#define ATT_GROUP(CHUNKS) att_group(qrs, ms, keys, nq, kr, vr, outs, ps, S + LANES, seen_w, Dh, CHUNKS, scale)
            switch (chunks) { /* head sizes 64 and 128 (LANES 16 or 8), 256 */
            case 4: ATT_GROUP(4); break;
            case 8: ATT_GROUP(8); break;
            case 16: ATT_GROUP(16); break;
            default: ATT_GROUP(chunks);
            }
#undef ATT_GROUP
        }
        free(ps), free(seen_w);
    }
}

/* The attention's vector width, which its head size must be a multiple of (`rowkernel.attention_fits`). */
int rows_lanes(void) { return LANES; }

void rows_matmul_q4(const float *x, long rows, long in, const unsigned char *w, float *y, long out, int threads);
void rows_matmul_i8dot(const float *x, long rows, long in, const signed char *w, float *y, long out, int threads);
void rows_matmul_q4dot(const float *x, long rows, long in, const unsigned char *w, float *y, long out, int threads);
void rows_matmul_q4dot16(const float *x, long rows, long in, const unsigned char *w, float *y, long out, int threads);
void rows_matmul_q8(const float *x, long rows, long in, const unsigned char *w, float *y, long out, int threads);
void rows_matmul_q6(const float *x, long rows, long in, const unsigned char *w, float *y, long out, int threads);

/* The weight kinds a matmul of rows_layer takes (rowkernel.LAYER_KINDS), each matmul its own: float32
 * weights, 4-bit or 8-bit codes giving them back (a GGUF's Q4_1 / Q4_0 / Q4_K, Q8_0 / Q5_0 and Q6_K
 * tensors: a Q4_K_M file mixes them within a layer), int8 codes with a scale per output (a drafting set's), or the
 * int4 precision's codes. */
enum { LAYER_F32, LAYER_Q4, LAYER_I8, LAYER_Q4DOT, LAYER_Q8, LAYER_Q6, LAYER_Q4DOT16 };
/* A GGUF matrix read in place (ggml/): kind LAYER_GGML_BASE + its ggml type, ggml_matmul's. */
#define LAYER_GGML_BASE 100
void ggml_matmul(int type, const float *x, long rows, long in, const unsigned char *w, float *y, long out,
                 int threads);

/* A matmul of rows_layer's in its `kind` (rows_matmul's, rows_matmul_q4's, rows_matmul_q8's,
 * rows_matmul_q6's, rows_matmul_q4dot's or rows_matmul_q4dot16's, ggml_matmul's, or rows_matmul_i8dot's
 * times `scale`, out floats). */
static void layer_matmul(int kind, const float *x, long rows, long in, const void *w, const float *scale,
                         float *y, long out, int threads) {
    if (kind == LAYER_Q4)
        rows_matmul_q4(x, rows, in, w, y, out, threads);
    else if (kind == LAYER_Q8)
        rows_matmul_q8(x, rows, in, w, y, out, threads);
    else if (kind == LAYER_Q6)
        rows_matmul_q6(x, rows, in, w, y, out, threads);
    else if (kind == LAYER_Q4DOT)
        rows_matmul_q4dot(x, rows, in, w, y, out, threads);
    else if (kind == LAYER_Q4DOT16)
        rows_matmul_q4dot16(x, rows, in, w, y, out, threads);
    else if (kind == LAYER_F32)
        rows_matmul(x, rows, in, w, y, out, threads);
    else if (kind >= LAYER_GGML_BASE)
        ggml_matmul(kind - LAYER_GGML_BASE, x, rows, in, w, y, out, threads);
    else {
        rows_matmul_i8dot(x, rows, in, w, y, out, threads);
        for (long r = 0; r < rows; r++)
            for (long j = 0; j < out; j++) y[r * out + j] *= scale[j];
    }
}

/* What a stack's layers share: the rows (B x T of D), the heads, the norms' eps, the MLP's width and
 * activation (0 silu, 1 GELU's tanh form), the softmax scale, the first cache index and the threads. */
struct layer_shape {
    int B, T, H, Hkv, Dh, act, threads;
    long D, F, start;
    float eps, scale;
};

/* A step's RoPE rows and mask, as rows_stack takes them for its global layers and its sliding-window
 * ones (rowkernel.View): cos, sin (B|1, T, Dh) at strides (cb, ct); visible, mb, mt as rows_attention's. */
struct rows_view {
    const float *cos, *sin;
    long cb, ct;
    const unsigned char *visible;
    long mb, mt;
};

/* One layer's arrays (rowkernel.LayerWeights, LAYER_PTRS pointers in this order): the input norm, the
 * post-attention norm, the weights of Q/K/V, O, gate/up and down, the int8 codes' scales (or NULL), the
 * layer's ints (its four matmuls' kinds, then 1 for a sliding-window layer), and the family's extras,
 * each NULL where the family has none: Q's and K's per-head norms, the Q/K/V biases, and Gemma's norms
 * of the MLP's input and output; last, K's and V's own weights where Q, K and V are three matmuls (a
 * GGUF's Q4_K_M file holds V in another format than Q and K: W_QKV is then Q's), their kinds the ints'
 * sixth and seventh, else NULL; and up's own weight where gate and up are two matmuls (W_GU then gate's;
 * the weights read in place from a GGUF's mapping), its kind the ints' eighth, else NULL. Norm weights
 * as applied (Gemma's 1 + w folded in). */
enum { W_NORM1, W_NORM2, W_QKV, W_O, W_GU, W_DOWN, W_SCALES, W_INTS, W_QNORM, W_KNORM, W_BIAS, W_NORM3, W_NORM4,
       W_K, W_V, W_UP };
#define LAYER_PTRS 16

/* y (R, stride) = x (R, in) times n matmuls side by side: part p (its kind and weight) writes width[p]
 * outputs at column at[p] of each row. Q/K/V or gate/up held as matmuls of their own (a GGUF's formats
 * differ among them, or its weights are read in place). */
static void side_by_side(const float *x, long R, long in, int n, const int *kind, const void *const *w,
                         const long *width, const long *at, float *y, long stride, int threads) {
    long widest = 0;
    for (int p = 0; p < n; p++) widest = width[p] > widest ? width[p] : widest;
    float *part = malloc(R * widest * sizeof(float));
    for (int p = 0; p < n; p++) {
        layer_matmul(kind[p], x, R, in, w[p], NULL, part, width[p], threads);
        for (long r = 0; r < R; r++) memcpy(y + r * stride + at[p], part + r * width[p], width[p] * sizeof(float));
    }
    free(part);
}

/* qkv (R, (H + 2 Hkv) Dh) = x (R, D) times Q/K/V: one matmul of W_QKV, or, where W_K is set, three
 * (Q's, K's, V's own weights and kinds) side by side. */
static void qkv_matmul(const float *x, const void *const *w, const struct layer_shape *s, long R, float *qkv) {
    const int *kinds = w[W_INTS];
    const long Dh = s->Dh, nq = (long)s->H * Dh, nkv = (long)s->Hkv * Dh, nqkv = nq + 2 * nkv;
    if (!w[W_K]) {
        layer_matmul(kinds[0], x, R, s->D, w[W_QKV], w[W_SCALES], qkv, nqkv, s->threads);
        return;
    }
    const void *part[3] = {w[W_QKV], w[W_K], w[W_V]};
    const int kind[3] = {kinds[0], kinds[5], kinds[6]};
    const long width[3] = {nq, nkv, nkv}, at[3] = {0, nq, nq + nkv};
    side_by_side(x, R, s->D, 3, kind, part, width, at, qkv, nqkv, s->threads);
}

/* The attention half's projections of rows_layer: x = norm1(h); qkv = x Wqkv (+ bias); each Q and K head
 * normed (where the family norms them), then rotated (half-split RoPE, as apply_rope); k, v written to
 * the cache at [start, start + T). qkv: (R, (H + 2 Hkv) Dh). */
static void layer_qkv(const float *h, const void *const *w, const struct layer_shape *s, const struct rows_view *view,
                      float *k, float *v, long kb, long kh, float *x, float *qkv) {
    const int *kinds = w[W_INTS];
    const float *bias = w[W_BIAS], *qn = w[W_QNORM], *kn = w[W_KNORM];
    const long R = (long)s->B * s->T, Dh = s->Dh, nqkv = (long)(s->H + 2 * s->Hkv) * Dh, half = Dh / 2;
    rows_rms_norm(h, R, s->D, w[W_NORM1], s->eps, x);
    qkv_matmul(x, w, s, R, qkv);
    for (long r = 0; r < R; r++) {
        const long b = r / s->T, t = r % s->T;
        const float *c = view->cos + b * view->cb + t * view->ct, *sn = view->sin + b * view->cb + t * view->ct;
        float *row = qkv + r * nqkv;
        if (bias)
            for (long i = 0; i < nqkv; i++) row[i] = row[i] + bias[i];
        for (int head = 0; head < s->H + s->Hkv; head++) { /* x cos + rotate_half(x) sin, as apply_rope */
            float *e = row + (long)head * Dh, rot[256];
            if (qn) rows_rms_norm(e, 1, Dh, head < s->H ? qn : kn, s->eps, e);
            for (long i = 0; i < half; i++) rot[i] = -e[half + i], rot[half + i] = e[i];
            for (long i = 0; i < Dh; i++) e[i] = e[i] * c[i] + rot[i] * sn[i];
        }
        for (int g = 0; g < s->Hkv; g++) { /* k (rotated) and v into the cache */
            const long at = b * kb + g * kh + (s->start + t) * Dh;
            for (long i = 0; i < Dh; i++) k[at + i] = row[(long)(s->H + g) * Dh + i];
            for (long i = 0; i < Dh; i++) v[at + i] = row[(long)(s->H + s->Hkv + g) * Dh + i];
        }
    }
}

/* A whole layer of a float32 decode step over R = B x T rows of one parameter set, in one call (Python
 * reaches it through rows_stack, for one layer or many): the step's ~25 torch calls and their Python
 * (a large share of a float32 step once the matmuls streamed at memory speed: docs/results-log.md)
 * become one. The same functions as `layers.DecodeSet`'s path, in its order: layer_qkv; o = attention;
 * y = o Wo; then Llama's h += y; x = norm2(h); or Gemma's h += norm2(y); x = norm3(h); then
 * g, u = x Wgu; y = (act(g) u) Wdown; h += y (Gemma's: h += norm4(y)); each row on its own (the matmuls
 * 1-9 rows a pass), so a row's bits do not depend on R.
 *
 * h: (R, D) row-major, updated in place. w: the layer's arrays (LAYER_PTRS, above): wqkv (H + 2 Hkv) Dh
 * outputs (Q, K, V heads), wo D from H Dh, wgu 2 F (gate, up), wdown D from F; int8 codes' scales in
 * the matmuls' order. k, v: the layer's cache (B, Hkv, capacity, Dh) at strides (kb, kh, Dh). */
static void rows_layer(float *h, const void *const *w, const struct layer_shape *s, const struct rows_view *view,
                       float *k, float *v, long kb, long kh) {
    const long R = (long)s->B * s->T, D = s->D, F = s->F, Dh = s->Dh, nqkv = (long)(s->H + 2 * s->Hkv) * Dh;
    const int *kinds = w[W_INTS];
    float *x = malloc(R * D * sizeof(float)), *qkv = malloc(R * nqkv * sizeof(float));
    float *o = malloc(R * (long)s->H * Dh * sizeof(float)), *y = malloc(R * D * sizeof(float));
    float *gu = malloc(R * 2 * F * sizeof(float)), *act = malloc(R * F * sizeof(float));
    const float *scales = w[W_SCALES], *so = scales ? scales + nqkv : 0, *sgu = scales ? so + D : 0;
    const float *sdown = scales ? sgu + 2 * F : 0;
    layer_qkv(h, w, s, view, k, v, kb, kh, x, qkv);
    rows_attention(qkv, s->T * nqkv, Dh, nqkv, k, v, kb, kh, view->visible, view->mb, view->mt, o, s->B, s->H,
                   s->Hkv, s->T, s->Dh, s->start, s->scale, s->threads);
    layer_matmul(kinds[1], o, R, (long)s->H * Dh, w[W_O], so, y, D, s->threads);
    if (w[W_NORM3]) rows_rms_norm(y, R, D, w[W_NORM2], s->eps, y); /* Gemma: the output normed first */
    for (long i = 0; i < R * D; i++) h[i] = h[i] + y[i];
    rows_rms_norm(h, R, D, w[W_NORM3] ? w[W_NORM3] : w[W_NORM2], s->eps, x);
    if (w[W_UP]) { /* gate and up, each its own matmul */
        const void *part[2] = {w[W_GU], w[W_UP]};
        const int kind[2] = {kinds[2], kinds[7]};
        const long width[2] = {F, F}, at[2] = {0, F};
        side_by_side(x, R, D, 2, kind, part, width, at, gu, 2 * F, s->threads);
    } else
        layer_matmul(kinds[2], x, R, D, w[W_GU], sgu, gu, 2 * F, s->threads);
    for (long r = 0; r < R; r++) act_mul(gu + r * 2 * F, gu + r * 2 * F + F, act + r * F, F, s->act);
    layer_matmul(kinds[3], act, R, F, w[W_DOWN], sdown, y, D, s->threads);
    if (w[W_NORM4]) rows_rms_norm(y, R, D, w[W_NORM4], s->eps, y);
    for (long i = 0; i < R * D; i++) h[i] = h[i] + y[i];
    free(x), free(qkv), free(o), free(y), free(gu), free(act);
}

/* Layers [0, n) of a stack over the same rows, each as rows_layer computes it, in one call: a step's 30
 * layer calls and their Python (module calls, argument views, ctypes: per-call overhead, a measurable
 * share of a one-row step, docs/results-log.md) become one. `layers` holds LAYER_PTRS pointers a layer
 * (rows_layer's); views[0] is the global layers' RoPE rows and mask, views[1] the sliding-window
 * layers'. k, v: layer 0's cache at strides (kb, kh, Dh), layer i's kl floats further. */
void rows_stack(float *h, int B, int T, long D, int n, const void *const *layers, float eps, long F, int act,
                const struct rows_view *views, float *k, float *v, long kl, long kb, long kh, int H, int Hkv,
                int Dh, long start, float scale, int threads) {
    const struct layer_shape s = {B, T, H, Hkv, Dh, act, threads, D, F, start, eps, scale};
    for (int i = 0; i < n; i++) {
        const void *const *w = layers + (long)i * LAYER_PTRS;
        const int sliding = ((const int *)w[W_INTS])[4];
        rows_layer(h, w, &s, views + sliding, k + i * kl, v + i * kl, kb, kh);
    }
}

int rows_layer_ptrs(void) { return LAYER_PTRS; }

/* ---- Helpers of the 4-bit and 8-bit float32 matmuls below ---- */
#define VB (BLK / LANES) /* vectors per block row */

/* LANES int8 codes from p widened to floats: one sign extension and one conversion where the compiler
 * exposes them (AVX512, AVX2); GCC's generic code for it goes through 16-bit halves or scalars. */
#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif
static inline __attribute__((always_inline)) vf widen(const signed char *p) {
#if defined(__AVX512F__)
    return (vf)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
#elif defined(__AVX2__)
    return (vf)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
#else
    vf f;
    for (int j = 0; j < LANES; j++) f[j] = (float)p[j];
    return f;
#endif
}

/* acc + a * b, one rounding (rows_matmul's fmaf), LANES at a time. */
static inline __attribute__((always_inline)) vf vfma(vf a, vf b, vf acc) {
#if defined(__AVX512F__)
    return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)acc);
#elif defined(__FMA__) && LANES == 8
    return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)acc);
#else
    for (int l = 0; l < LANES; l++) acc[l] = fmaf(a[l], b[l], acc[l]);
    return acc;
#endif
}

/* 2-9 rows (a verifying step) in the 4-bit and 8-bit matmuls: a pair of vectors of a column block at a
 * time, so that R x 2 sums and the pair's weight vectors stay in registers: AVX512's 32 hold 9 rows,
 * AVX2's 16 six; more rows take another pass. */
#if defined(__AVX512F__)
#define PAIR_MAX_R 9
/* A kernel's 7-9-row pair functions (FN's NAME P7..P9) and their table entries, where a pass takes 9. */
#define PAIRS_7_TO_9(FN, P) FN(P##7, 7) FN(P##8, 8) FN(P##9, 9)
#define PAIRS_7_TO_9_LIST(P) , P##7, P##8, P##9
#else
#define PAIR_MAX_R 6
#define PAIRS_7_TO_9(FN, P)
#define PAIRS_7_TO_9_LIST(P)
#endif

/* acc[r][0..1] += x[r * in + i] * (w0, w1) for R rows, one rounding each. */
#define PAIR_FMAS(R, x, in, i, w0, w1)                                                                      \
    for (int r = 0; r < R; r++) {                                                                           \
        const vf xr = splat((x)[r * (in) + (i)]);                                                           \
        acc[r][0] = vfma(xr, w0, acc[r][0]), acc[r][1] = vfma(xr, w1, acc[r][1]);                           \
    }

/* Pair p's sums of R rows into y (rows, out) at column block b, whose first n outputs are real. */
#define PAIR_STORE(R, p)                                                                                    \
    for (int r = 0; r < R; r++)                                                                             \
        for (long j = (p) * 2 * LANES; j < n && j < ((p) + 1) * 2 * LANES; j++)                             \
            y[r * out + b * BLK + j] = acc[r][(j / LANES) % 2][j % LANES];

/* x broadcast to a vector. */
static inline __attribute__((always_inline)) vf splat(float x) {
#if defined(__AVX512F__)
    return (vf)_mm512_set1_ps(x);
#elif defined(__AVX__) && LANES == 8
    return (vf)_mm256_set1_ps(x);
#else
    vf v;
    for (int l = 0; l < LANES; l++) v[l] = x;
    return v;
#endif
}

/* ---- A drafting set's int8 matmul on integer dot products: activations quantized per row ----
 *
 * Why: a NAR set's drafting pass ran its int8 codes through a float loop (each code widened to a float,
 * a float FMA spent on it): a few slots over SmolLM2's 4 NAR layers (14 MB of codes) were
 * compute-bound, well below memory speed. Here each row of x is quantized to int8 (symmetric, scale
 * max |x| / 127) and multiplied by the codes in integer arithmetic, 32 products per three AVX2
 * instructions (sign, maddubs, madd; two with AVX512-VNNI: sign, dpbusd): faster at every row count, 4
 * rows at memory speed (timings: docs/results-log.md). Drafts only: the activations' rounding (about
 * the size of torch's dynamic int8's) never reaches a verified token.
 *
 * Layout (rowkernel.dot_block): W (out, in) int8 codes, -127..127, in a multiple of 4, as column blocks
 * of DOT_BLK outputs, (ceil(out / DOT_BLK), in / 4, DOT_BLK, 4): per block and quad of inputs, each
 * output's 4 codes side by side, one 32-bit lane of a vector. Each block is one contiguous stream.
 *
 * Exactness: a row's sums are exact integers (|sum| <= in x 127 x 127), so its result is the same in
 * every build (the plain loop below computes the same integers) and every call; its rounding is the
 * quantization, then (float)sum * scale. */
#define DOT_BLK 8
#define PREFETCH_DOT 1024

/* One group's int8 codes c (n of them) of x and its largest |x| and code sum, in whole vectors: 0, or 1
 * (nothing written) where n is not whole vectors, a value is not finite or 127 / amax overflows (then
 * the plain loop of quantize_groups, which skips NaN and clamps). The same values as that loop: the exact maximum, the same float
 * product x * inv, rounded to nearest even as nearbyintf (the default rounding mode), never beyond 127
 * (|x| <= amax, so x * inv <= 127 (1 + 2^-23)). Why: in the plain loop the quantization was a large share
 * of the int4 matmul's time at 9 rows (each of a layer's matmuls quantizes its input rows;
 * docs/results-log.md). */
#if defined(__AVX512F__)
static int quantize_vectors(const float *xg, long n, signed char *c, float *amax, int *sum) {
    if (n % 16) return 1;
    const __m512 inf = _mm512_set1_ps(INFINITY);
    __m512 top = _mm512_setzero_ps();
    for (long i = 0; i < n; i += 16) {
        const __m512 a = _mm512_abs_ps(_mm512_loadu_ps(xg + i));
        if (_mm512_cmp_ps_mask(a, inf, _CMP_LT_OQ) != 0xFFFF) return 1; /* inf or NaN */
        top = _mm512_max_ps(top, a);
    }
    const float m = _mm512_reduce_max_ps(top), inv = m > 0.f ? 127.f / m : 0.f;
    if (!(inv < INFINITY)) return 1; /* a subnormal maximum: 127 / m overflows */
    __m512i total = _mm512_setzero_si512();
    for (long i = 0; i < n; i += 16) {
        const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xg + i), _mm512_set1_ps(inv)));
        _mm_storeu_si128((__m128i *)(c + i), _mm512_cvtepi32_epi8(q));
        total = _mm512_add_epi32(total, q);
    }
    *amax = m, *sum = _mm512_reduce_add_epi32(total);
    return 0;
}
#elif defined(__AVX2__)
static int quantize_vectors(const float *xg, long n, signed char *c, float *amax, int *sum) {
    if (n % 8) return 1;
    const __m256 inf = _mm256_set1_ps(INFINITY), sign = _mm256_set1_ps(-0.f);
    __m256 top = _mm256_setzero_ps();
    for (long i = 0; i < n; i += 8) {
        const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(xg + i));
        if (_mm256_movemask_ps(_mm256_cmp_ps(a, inf, _CMP_LT_OQ)) != 0xFF) return 1; /* inf or NaN */
        top = _mm256_max_ps(top, a);
    }
    __m128 t = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
    t = _mm_max_ps(t, _mm_movehl_ps(t, t));
    const float m = _mm_cvtss_f32(_mm_max_ss(t, _mm_movehdup_ps(t))), inv = m > 0.f ? 127.f / m : 0.f;
    if (!(inv < INFINITY)) return 1; /* a subnormal maximum: 127 / m overflows */
    int s = 0;
    for (long i = 0; i < n; i += 8) {
        int q[8];
        _mm256_storeu_si256((__m256i *)q, _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + i), _mm256_set1_ps(inv))));
        for (int k = 0; k < 8; k++) c[i + k] = (signed char)q[k], s += q[k];
    }
    *amax = m, *sum = s;
    return 0;
}
#else
static int quantize_vectors(const float *xg, long n, signed char *c, float *amax, int *sum) {
    (void)xg, (void)n, (void)c, (void)amax, (void)sum;
    return 1;
}
#endif

/* x (rows, in) quantized to int8 per group of `group` inputs (symmetric, scale max |x| / 127 of the
 * group): xq (rows, in / 4) quads of codes; sx (rows, in / group) the groups' scales; xs, where given,
 * (rows, in / group) each scale times its group's code sum (the int4 matmul's factor for m). Rows are
 * whole groups for the drafting set's int8 matmul (group = in), groups of Q4_GROUP for the int4 one. */
static void quantize_groups(const float *x, long rows, long in, long group, int *xq, float *sx, float *xs) {
    const long groups = in / group;
    for (long r = 0; r < rows; r++)
        for (long g = 0; g < groups; g++) {
            const float *xg = x + r * in + g * group;
            signed char *c = (signed char *)(xq + r * (in / 4)) + g * group;
            float amax = 0.f;
            int sum = 0;
            if (quantize_vectors(xg, group, c, &amax, &sum)) {
                for (long i = 0; i < group; i++) amax = fabsf(xg[i]) > amax ? fabsf(xg[i]) : amax; /* NaN skipped */
                const float inv = amax > 0.f && amax < INFINITY ? 127.f / amax : 0.f;
                for (long i = 0; i < group; i++) {
                    const float q = nearbyintf(xg[i] * inv); /* NaN (a broken row) becomes 0, not undefined */
                    c[i] = q > 127.f ? 127 : q < -127.f ? -127 : q == q ? (signed char)q : 0;
                    sum += c[i];
                }
            }
            sx[r * groups + g] = amax / 127.f;
            if (xs) xs[r * groups + g] = amax / 127.f * (float)sum;
        }
}

/* R rows' sums over one column block (quads x DOT_BLK x 4 codes at w) into sums (R, DOT_BLK). AVX2:
 * |w| times x with w's signs (so that maddubs's unsigned operand is |w| <= 127 and its pairs cannot
 * saturate), then pairs of 16-bit products to 32 bits. */
#if defined(__AVX2__)
/* acc + the sums of each 4 adjacent products of unsigned bytes u and signed bytes s, per 32-bit lane:
 * one VNNI instruction (AVX512's, or AVX-VNNI's), else maddubs (16-bit pair sums, which the callers'
 * operands cannot saturate: u <= 127, or u <= 15) and madd with `ones` (a vector of 16-bit ones in the
 * caller's scope). */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define DPBUSD(acc, u, s) _mm256_dpbusd_epi32(acc, u, s)
#elif defined(__AVXVNNI__) /* AVX-VNNI's VEX form, on CPUs with it but without AVX512 */
#define DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32(acc, u, s)
#else
#define DPBUSD(acc, u, s) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones))
#endif
/* R rows over NB adjacent column blocks (each `quads` quads on): sums (NB, R, DOT_BLK), NB memory
 * streams (DOT_PASSES_NB), each prefetched PREFETCH_DOT bytes ahead into every cache level. */
#define DOT_FN(NAME, R, NB)                                                                                 \
    static void NAME(const int *xq, long quads, const signed char *w, int *sums) {                          \
        __attribute__((unused)) const __m256i ones = _mm256_set1_epi16(1);                                  \
        __m256i acc[NB][R];                                                                                 \
        for (int b = 0; b < NB; b++)                                                                        \
            for (int r = 0; r < R; r++) acc[b][r] = _mm256_setzero_si256();                                 \
        for (long q = 0; q < quads; q++) {                                                                  \
            _Pragma("GCC unroll 8") for (int b = 0; b < NB; b++) {                                          \
                const signed char *wq = w + (b * quads + q) * DOT_BLK * 4;                                  \
                if (q % 2 == 0) __builtin_prefetch(wq + PREFETCH_DOT, 0, 3);                                \
                const __m256i wv = _mm256_loadu_si256((const __m256i *)wq), aw = _mm256_abs_epi8(wv);       \
                for (int r = 0; r < R; r++) {                                                               \
                    const __m256i xs = _mm256_sign_epi8(_mm256_set1_epi32(xq[r * quads + q]), wv);          \
                    acc[b][r] = DPBUSD(acc[b][r], aw, xs);                                                  \
                }                                                                                           \
            }                                                                                               \
        }                                                                                                   \
        for (int b = 0; b < NB; b++)                                                                        \
            for (int r = 0; r < R; r++) _mm256_storeu_si256((__m256i *)(sums + (b * R + r) * DOT_BLK), acc[b][r]); \
    }
#else
#define DOT_FN(NAME, R, NB)                                                                                 \
    static void NAME(const int *xq, long quads, const signed char *w, int *sums) {                          \
        for (int b = 0; b < NB; b++)                                                                        \
            for (int r = 0; r < R; r++) {                                                                   \
                const signed char *x = (const signed char *)(xq + r * quads), *wb = w + b * quads * DOT_BLK * 4; \
                for (int j = 0; j < DOT_BLK; j++) {                                                         \
                    int s = 0;                                                                              \
                    for (long i = 0; i < quads * 4; i++) s += x[i] * wb[(i / 4 * DOT_BLK + j) * 4 + i % 4]; \
                    sums[(b * R + r) * DOT_BLK + j] = s;                                                    \
                }                                                                                           \
            }                                                                                               \
    }
#endif
/* Blocks a call by rows, as Q4DOT_NB. */
static const long DOT_NB[MAX_R + 1] = {0, 4, 4, 2, 2, 1, 1, 1, 1, 1};
DOT_FN(dot_1, 1, 4)
DOT_FN(dot_2, 2, 4)
DOT_FN(dot_3, 3, 2)
DOT_FN(dot_4, 4, 2)
DOT_FN(dot_5, 5, 1)
DOT_FN(dot_6, 6, 1)
DOT_FN(dot_7, 7, 1)
DOT_FN(dot_8, 8, 1)
DOT_FN(dot_9, 9, 1)
DOT_FN(dot_1_1, 1, 1)
DOT_FN(dot_2_1, 2, 1)
DOT_FN(dot_3_1, 3, 1)
DOT_FN(dot_4_1, 4, 1)
typedef void (*dot_fn)(const int *, long, const signed char *, int *);
static const dot_fn DOTS[MAX_R + 1] = {0, dot_1, dot_2, dot_3, dot_4, dot_5, dot_6, dot_7, dot_8, dot_9};
static const dot_fn DOTS_1[MAX_R + 1] = {0, dot_1_1, dot_2_1, dot_3_1, dot_4_1, dot_5, dot_6, dot_7, dot_8, dot_9};

/* The passes of an integer-dot matmul over its quantized rows xq: MAX_R rows a pass, its column blocks
 * shared among `threads`, NBS[R] adjacent blocks a call where R rows take them (1 for the blocks left
 * over); BLOCK (a call) fills `sums` (n, R, DOT_BLK) of SUM_T for the n blocks from b of rows r0..,
 * VALUE is output j of row r of block k from sums[(k * R + r) * DOT_BLK + j] (`blocks` and `out` in the
 * caller's scope). Why several blocks a call: one block at a time is one memory stream and one
 * dependent chain a row, and a one-row int4 step ran at a fifth of the memory's speed; NB streams at
 * once, each with its own chains, keep the loads and the units busy (docs/results-log.md). Each
 * output's arithmetic is the one-block call's, so the bits are the same whatever NB. */
#define MAX_NB 8
#define DOT_PASSES_NB(SUM_T, NBS, BLOCK, VALUE)                                                             \
    for (long r0 = 0; r0 < rows; r0 += MAX_R) {                                                             \
        const long R = rows - r0 < MAX_R ? rows - r0 : MAX_R, nb = NBS[R];                                  \
        const long full = blocks / nb, calls = full + blocks % nb;                                          \
        _Pragma("omp parallel for num_threads(threads) schedule(static) if (threads > 1)")                 \
        for (long c = 0; c < calls; c++) {                                                                  \
            const long b = c < full ? c * nb : full * nb + (c - full), n = c < full ? nb : 1;               \
            SUM_T sums[MAX_NB * MAX_R * DOT_BLK];                                                           \
            BLOCK;                                                                                          \
            for (long k = 0; k < n; k++) {                                                                  \
                const long o = (b + k) * DOT_BLK, width = out - o < DOT_BLK ? out - o : DOT_BLK;            \
                for (long r = 0; r < R; r++)                                                                \
                    for (long j = 0; j < width; j++) y[(r0 + r) * out + o + j] = VALUE;                     \
            }                                                                                               \
        }                                                                                                   \
    }

/* y (rows, out) = quantized x (rows, in) @ codes.t() times each row's scale (the caller applies the
 * codes' scales), codes in rowkernel.dot_block's layout. */
void rows_matmul_i8dot(const float *x, long rows, long in, const signed char *w, float *y, long out, int threads) {
    const long quads = in / 4, blocks = (out + DOT_BLK - 1) / DOT_BLK;
    int *xq = malloc(rows * quads * sizeof(int));
    float *sx = malloc(rows * sizeof(float));
    quantize_groups(x, rows, in, in, xq, sx, NULL);
    DOT_PASSES_NB(int, DOT_NB, (n == 1 ? DOTS_1 : DOTS)[R](xq + r0 * quads, quads, w + b * quads * DOT_BLK * 4, sums),
                  (float)sums[(k * R + r) * DOT_BLK + j] * sx[r0 + r])
    free(xq), free(sx);
}

int rows_dot_block(void) { return DOT_BLK; }

/* ---- A float32 matmul on weights held as 4-bit codes: the same bits as rows_matmul, a fifth of the bytes ----
 *
 * Why: a float32 step streams every weight (SmolLM2's layers: 425 MB a step), yet a GGUF's Q4_1 weights,
 * dequantized to float32, are code * d + m per group of 32 inputs, with d and m float16 values: 4 bits
 * a weight and two scalars a group say the same floats. rowkernel.q4_block finds the codes and checks
 * that they give back every float exactly; this loop then rebuilds each weight (code * d is exact in
 * float32: 4 bits by 11, so one rounding in + m, whether fused or not) and runs rows_matmul's fmaf chain
 * on it: a row's result is rows_matmul's bits on the float32 weight, at 0.75 bytes a weight.
 *
 * Layout (rowkernel.q4_block): per column block of BLK outputs, per group of Q4_GROUP inputs, one
 * contiguous Q4_GROUP_BYTES record: d (BLK floats), m (BLK floats), then per input BLK / 2 bytes, LANES
 * per pair of vectors (2 LANES outputs), whose byte k holds the pair's output k in its low nibble and
 * output LANES + k in its high one (rows_q4_pack). */
#define Q4_GROUP 32
#define Q4_GROUP_BYTES (2 * BLK * (long)sizeof(float) + Q4_GROUP * BLK / 2)
#define PREFETCH_Q4 1536 /* bytes ahead: two groups' records */

/* The LANES codes of two vectors (LANES bytes at p: low nibbles the first, high the second) as floats. */
static inline __attribute__((always_inline)) void nibble_pair(const unsigned char *p, vf *lo, vf *hi) {
#if defined(__AVX512F__)
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    *lo = (vf)_mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(15)));
    *hi = (vf)_mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
#elif defined(__AVX2__)
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    *lo = (vf)_mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15)));
    *hi = (vf)_mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
#else
    for (int l = 0; l < LANES; l++) (*lo)[l] = (float)(p[l] & 15), (*hi)[l] = (float)(p[l] >> 4);
#endif
}

/* One row of the 4-bit and 8-bit matmuls: all VB vectors of a column block per input (4 sum chains on
 * AVX2, for the FMA latency), a group of Q4_GROUP inputs at a time. SETUP reads the group's scales (and
 * minimums) for all VB vectors from its record `rec`; REBUILD makes input i's weight vectors wv[0..VB). */
#define CODES_ONE_ROW_FN(NAME, GROUP, GROUP_BYTES, SETUP, REBUILD)                                          \
    static void NAME(const float *x, long in, const unsigned char *w, float *y, long out, long b) {         \
        const long groups = in / (GROUP), n = out - b * BLK < BLK ? out - b * BLK : BLK;                   \
        vf acc[VB];                                                                                         \
        for (int v = 0; v < VB; v++) acc[v] = (vf){0};                                                      \
        for (long g = 0; g < groups; g++) {                                                                 \
            const unsigned char *rec = w + g * (GROUP_BYTES);                                               \
            SETUP                                                                                           \
            for (int i = 0; i < (GROUP); i++) {                                                            \
                vf wv[VB];                                                                                  \
                REBUILD                                                                                     \
                const vf xr = splat(x[g * (GROUP) + i]);                                                   \
                for (int v = 0; v < VB; v++) acc[v] = vfma(xr, wv[v], acc[v]);                              \
            }                                                                                               \
        }                                                                                                   \
        for (long j = 0; j < n; j++) y[b * BLK + j] = acc[j / LANES][j % LANES];                            \
    }

/* The 4-bit row: d and m vectors per group; per input, each pair of vectors' nibbles from LANES bytes. */
#define Q4_ROW_SETUP                                                                                        \
    const float *d = (const float *)rec, *m = d + BLK;                                                      \
    vf dv[VB], mv[VB];                                                                                      \
    for (int v = 0; v < VB; v++) dv[v] = *(const vf *)(d + v * LANES), mv[v] = *(const vf *)(m + v * LANES);
#define Q4_ROW_REBUILD                                                                                      \
    const unsigned char *wi = rec + 2 * BLK * sizeof(float) + i * (BLK / 2);                                \
    __builtin_prefetch(wi + PREFETCH_Q4, 0, 3);                                                             \
    for (int v = 0; v < VB; v += 2) {                                                                       \
        nibble_pair(wi + v / 2 * LANES, &wv[v], &wv[v + 1]);                                                \
        wv[v] = wv[v] * dv[v] + mv[v], wv[v + 1] = wv[v + 1] * dv[v + 1] + mv[v + 1];                       \
    }
CODES_ONE_ROW_FN(q4_one_row, Q4_GROUP, Q4_GROUP_BYTES, Q4_ROW_SETUP, Q4_ROW_REBUILD)

/* 2+ rows of the 4-bit and 8-bit matmuls: by pairs of vectors (PAIR_FMAS), a group of Q4_GROUP inputs
 * at a time. SETUP reads the pair's scales (and minimums) from the group's record `rec`; REBUILD makes the
 * pair's two weight vectors w0, w1 of input i from its codes, exactly (see each kind's comment). */
#define CODES_PAIRS_FN(NAME, R, GROUP, GROUP_BYTES, SETUP, REBUILD)                                         \
    static void NAME(const float *x, long in, const unsigned char *w, float *y, long out, long b) {         \
        const long groups = in / (GROUP), n = out - b * BLK < BLK ? out - b * BLK : BLK;                   \
        for (int p = 0; p < VB / 2; p++) {                                                                  \
            vf acc[R][2];                                                                                   \
            for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = (vf){0};                                    \
            for (long g = 0; g < groups; g++) {                                                             \
                const unsigned char *rec = w + g * (GROUP_BYTES);                                           \
                SETUP                                                                                       \
                for (int i = 0; i < (GROUP); i++) {                                                        \
                    vf w0, w1;                                                                              \
                    REBUILD                                                                                 \
                    PAIR_FMAS(R, x, in, g * (GROUP) + i, w0, w1)                                           \
                }                                                                                           \
            }                                                                                               \
            PAIR_STORE(R, p)                                                                                \
        }                                                                                                   \
    }

/* The 4-bit pair: its d and m vectors per group; per input, both vectors' nibbles from LANES bytes. */
#define Q4_SETUP                                                                                            \
    const float *d = (const float *)rec + p * 2 * LANES, *m = d + BLK;                                      \
    const vf d0 = *(const vf *)d, d1 = *(const vf *)(d + LANES);                                            \
    const vf m0 = *(const vf *)m, m1 = *(const vf *)(m + LANES);                                            \
    const unsigned char *codes = rec + 2 * BLK * sizeof(float) + p * LANES;
#define Q4_REBUILD                                                                                          \
    __builtin_prefetch(codes + i * (BLK / 2) + PREFETCH_Q4, 0, 3);                                          \
    nibble_pair(codes + i * (BLK / 2), &w0, &w1);                                                           \
    w0 = w0 * d0 + m0, w1 = w1 * d1 + m1;
#define Q4_PAIRS_FN(NAME, R) CODES_PAIRS_FN(NAME, R, Q4_GROUP, Q4_GROUP_BYTES, Q4_SETUP, Q4_REBUILD)

/* 2-9 rows: by pairs of vectors (PAIR_FMAS; the column block's codes read once per pair, the second
 * pair's from cache, the pair's 4 scale vectors in registers with its sums). Each extra row costs the
 * FMA units' pace (a float FMA per weight and row); with AVX2's 16 registers 7-9 rows take two passes,
 * which beat one spilled pass. Tried and slower: all VB vectors per row for 2-4 rows (spilled from 3
 * rows), each group's tile rebuilt once into L1 for 5-9 rows. Timings: docs/results-log.md. */
#define Q4_MAX_R PAIR_MAX_R
Q4_PAIRS_FN(q4_pairs_2, 2)
Q4_PAIRS_FN(q4_pairs_3, 3)
Q4_PAIRS_FN(q4_pairs_4, 4)
Q4_PAIRS_FN(q4_pairs_5, 5)
Q4_PAIRS_FN(q4_pairs_6, 6)
PAIRS_7_TO_9(Q4_PAIRS_FN, q4_pairs_)
typedef void (*q4_block_fn)(const float *, long, const unsigned char *, float *, long, long);
static const q4_block_fn Q4_BLOCKS[Q4_MAX_R + 1] = {0, q4_one_row, q4_pairs_2, q4_pairs_3, q4_pairs_4, q4_pairs_5, q4_pairs_6 PAIRS_7_TO_9_LIST(q4_pairs_)};
static const int Q4_STREAMS[MAX_R + 1] = {0, 1, 1, 1, 1, 1, 1, 1, 1, 1}; /* one column block a call */

/* A column block's weights rebuilt from its 4-bit codes into `tile` (in, BLK) floats, rowkernel.block's
 * layout: each value as Q4_REBUILD makes it (code * d + m, one rounding), so the same floats. */
static void q4_tile(const unsigned char *w, long in, float *tile) {
    const long groups = in / Q4_GROUP;
    for (int p = 0; p < VB / 2; p++)
        for (long g = 0; g < groups; g++) {
            const unsigned char *rec = w + g * Q4_GROUP_BYTES;
            Q4_SETUP
            for (int i = 0; i < Q4_GROUP; i++) {
                vf w0, w1;
                Q4_REBUILD
                float *t = tile + (g * Q4_GROUP + i) * BLK + p * 2 * LANES;
                *(vf *)t = w0, *(vf *)(t + LANES) = w1;
            }
        }
}

/* y (rows, out) = x (rows, in) @ W.t(), W in rowkernel.q4_block's layout (in a multiple of Q4_GROUP).
 * More rows than a pass takes (a prefill, a large batch's step): each column block is rebuilt once into a
 * float tile (in L2: 72-196 KB for SmolLM2) and the float32 kernel's passes run over it, so the
 * rebuilding, a pass's fixed cost, is paid once a block, not once a pass; the floats and the fmaf chain
 * are the same, so are the bits (the tests check them against fewer rows). */
void rows_matmul_q4(const float *x, long rows, long in, const unsigned char *w, float *y, long out, int threads) {
    if (rows <= Q4_MAX_R) {
        MATMUL_PASSES(Q4_BLOCKS, Q4_BLOCKS, Q4_STREAMS, Q4_MAX_R, in / Q4_GROUP * Q4_GROUP_BYTES)
        return;
    }
    const long blocks = (out + BLK - 1) / BLK, bs = in / Q4_GROUP * Q4_GROUP_BYTES;
    _Pragma("omp parallel num_threads(threads) if (threads > 1)") {
        float *tile = aligned_alloc(64, in * BLK * sizeof(float)); /* in * BLK * 4 is a multiple of 64 */
        _Pragma("omp for schedule(static)") for (long b = 0; b < blocks; b++) {
            q4_tile(w + b * bs, in, tile);
            for (long r0 = 0; r0 < rows; r0 += MAX_R) {
                const long R = rows - r0 < MAX_R ? rows - r0 : MAX_R;
                SINGLES[R](x + r0 * in, in, tile, y + r0 * out, out, b);
            }
        }
        free(tile);
    }
}

/* f rounded to 11 significant bits, to nearest even: a float16 value where f is in float16's normal range. */
static float half_round(float f) {
    union {
        float f;
        unsigned u;
    } v = {f};
    v.u = (v.u + 0xFFFu + ((v.u >> 13) & 1u)) & ~0x1FFFu;
    return v.f;
}

/* Significant bits of a Q4_K scale or minimum: a float16 (11) times a 6-bit sub-scale. */
#define K_BITS 17

/* f rounded to `bits` significant bits (2..23), to nearest even (half_round's rule, any width). */
static float bits_round(float f, int bits) {
    union {
        float f;
        unsigned u;
    } v = {f};
    const int drop = 24 - bits;
    v.u = (v.u + ((1u << (drop - 1)) - 1u) + ((v.u >> drop) & 1u)) & ~((1u << drop) - 1u);
    return v.f;
}

/* A group's codes c (Q4_GROUP) for the form (d, m): round((w - m) / d), each in 0..15 and giving its
 * value back exactly as fmaf(c, d, m) with d of at most K_BITS significant bits (so that c * d is
 * exact, 4 bits by 17, and the kernel's rebuilt weight is w however it adds m). 0 where every value is
 * such, else 1. */
static int q4_group_codes(const float *wg, float d, float m, int *c) {
    if (bits_round(d, K_BITS) != d) return 1; /* NaN fails too */
    const float inv = d != 0.f ? 1.f / d : 0.f;
    for (int i = 0; i < Q4_GROUP; i++) {
        const float t = (wg[i] - m) * inv;
        if (!(t > -0.5f && t < 15.5f)) return 1; /* NaN fails too */
        c[i] = (int)(t + 0.5f);
        if (fmaf((float)c[i], d, m) != wg[i]) return 1;
    }
    return 0;
}

/* A group's (d, m) and codes c in Q4_K's form, d = d16 * sc and m = -(dmin16 * mn) per group of 32, each
 * of K_BITS bits, codes 0..15 that need not reach either end: d is the smallest gap between the group's
 * values (one code apart, or two where no neighbouring codes occur), rounded to K_BITS bits (each value's
 * rounding is far below that grid), m then the smallest value lo less its code's q * d, rounded alike, q
 * tried from 0 to 15. 0 where a form gives every value back (q4_group_codes), else 1. */
static int q4k_group(const float *wg, float lo, float hi, float *d, float *m, int *c) {
    *d = bits_round((hi - lo) / 15.f, K_BITS), *m = lo; /* first, codes 0..15 both used: no search */
    if (!q4_group_codes(wg, *d, *m, c)) return 0;
    float sorted[Q4_GROUP], gap = INFINITY;
    for (int i = 0; i < Q4_GROUP; i++) { /* insertion sort: neighbours then hold the gaps */
        int j = i;
        for (; j > 0 && sorted[j - 1] > wg[i]; j--) sorted[j] = sorted[j - 1];
        sorted[j] = wg[i];
    }
    for (int i = 1; i < Q4_GROUP; i++) {
        const float g = sorted[i] - sorted[i - 1];
        gap = g > 0.f && g < gap ? g : gap;
    }
    if (!(gap < INFINITY)) return 1; /* one value (the Q4_1 form's), or NaN */
    for (int k = 1; k <= 2; k++) {
        *d = bits_round(gap / (float)k, K_BITS);
        for (int q = 0; q < 16; q++) {
            *m = bits_round(lo - (float)q * *d, K_BITS);
            if (!q4_group_codes(wg, *d, *m, c)) return 0;
        }
    }
    return 1;
}

/* A group's (d, m) and codes c, the first form that gives its every value back: Q4_1's (its minimum code
 * 0, its maximum 15), else Q4_0's, whose value of largest magnitude v0 is code 0: (code - 8) d =
 * fmaf(code, d, v0), d = -v0 / 8, else Q4_K's (q4k_group). 0, or 1 where no form does. */
static int q4_group_form(const float *wg, float *d, float *m, int *c) {
    float lo = wg[0], hi = wg[0];
    for (int i = 1; i < Q4_GROUP; i++) lo = wg[i] < lo ? wg[i] : lo, hi = wg[i] > hi ? wg[i] : hi;
    const float forms[3][2] = {{half_round((hi - lo) / 15.f), lo}, {-lo / 8.f, lo}, {-hi / 8.f, hi}};
    for (int f = 0; f < 3; f++)
        if (!q4_group_codes(wg, forms[f][0], forms[f][1], c)) return *d = forms[f][0], *m = forms[f][1], 0;
    return q4k_group(wg, lo, hi, d, m, c); /* Q4_K's, last: the dearest to find */
}

/* Output j's group (d, m, codes c) into its record `rec` (zeroed before): d and m at j, each code in its
 * input's BLK / 2 bytes, the byte and nibble rows_matmul_q4 reads. */
static void q4_record_put(unsigned char *rec, long j, float d, float m, const int *c) {
    ((float *)rec)[j] = d, ((float *)rec)[BLK + j] = m;
    const long pair = j / (2 * LANES), shift = j % (2 * LANES) / LANES * 4;
    unsigned char *codes = rec + 2 * BLK * sizeof(float) + pair * LANES + j % LANES;
    for (int i = 0; i < Q4_GROUP; i++) codes[i * (BLK / 2)] |= (unsigned char)(c[i] << shift);
}

/* Column block b of rows_q4_pack: 0, or 1 where a group has no form. */
static int q4_pack_block(const float *w, long b, long out, long groups, long so, long si, unsigned char *dst) {
    float tile[BLK][Q4_GROUP];
    const long n = out - b * BLK < BLK ? out - b * BLK : BLK;
    for (long g = 0; g < groups; g++) {
        if (si == 1)
            for (long j = 0; j < n; j++)
                for (int i = 0; i < Q4_GROUP; i++) tile[j][i] = w[(b * BLK + j) * so + g * Q4_GROUP + i];
        else
            for (int i = 0; i < Q4_GROUP; i++)
                for (long j = 0; j < n; j++) tile[j][i] = w[(b * BLK + j) * so + (g * Q4_GROUP + i) * si];
        unsigned char *rec = dst + (b * groups + g) * Q4_GROUP_BYTES;
        for (long j = 0; j < n; j++) {
            float d, m;
            int c[Q4_GROUP];
            if (q4_group_form(tile[j], &d, &m, c)) return 1;
            q4_record_put(rec, j, d, m, c);
        }
    }
    return 0;
}

/* W (out, in) float32 at strides (so, si) (output-major, or a tied head's input-major storage), in a
 * multiple of Q4_GROUP, into rows_matmul_q4's layout at dst (ceil(out / BLK) x in / Q4_GROUP records of
 * Q4_GROUP_BYTES, zeroed by the caller), a BLK x Q4_GROUP tile at a time. Each group of an output takes
 * the first form (d, m) whose codes give back its every value (q4_group_codes): a GGUF's Q4_1 weights
 * dequantized (m the minimum, d (max - m) / 15 rounded to float16), its Q4_0 ones ((code - 8) d:
 * m = -8 d, the group's value of largest magnitude at code 0), or its Q4_K ones (q4k_group). Returns 0,
 * or 1 where a group has no such form, so a weight either gives its exact bits back or is refused.
 * Column blocks are packed on `threads` threads (each block's records are its own: the same bytes
 * whatever the count); a refusal stops the blocks not yet started. */
int rows_q4_pack(const float *w, long out, long in, long so, long si, unsigned char *dst, int threads) {
    const long groups = in / Q4_GROUP, blocks = (out + BLK - 1) / BLK;
    int refused = 0;
#pragma omp parallel for schedule(dynamic) num_threads(threads) if (threads > 1 && blocks > 1)
    for (long b = 0; b < blocks; b++) {
        int stop;
#pragma omp atomic read
        stop = refused;
        if (!stop && q4_pack_block(w, b, out, groups, so, si, dst)) {
#pragma omp atomic write
            refused = 1;
        }
    }
    return refused;
}

int rows_code_group(void) { return Q4_GROUP; } /* = Q8_GROUP */
int rows_q4_bytes(void) { return Q4_GROUP_BYTES; }

/* ---- The int4 precision's matmul: 4-bit codes times activations quantized to int8, integer dot products ----
 *
 * Why: rows_matmul_q4 rebuilds each float32 weight from its code and spends a float FMA on it per row, so
 * a float32 verifying row costs the FMA units' pace and a step's extra rows are dear. The int4 precision instead quantizes each activation row to int8 per
 * group of Q4_GROUP inputs (scale sx = max |x| / 127 of the group, as llama.cpp's Q8_1) and multiplies
 * the GGUF's Q4_1 codes (0..15, d and m per group) in integer arithmetic: per output and group,
 *   y += (sum_i code_i xq_i) * (d sx) + m * (sx sum_i xq_i),
 * 32 products per instruction pair (maddubs, madd; one dpbusd with VNNI). The weights' codes, d and m
 * are the file's exactly; the activations' rounding is the precision's loss (its NLL is reported).
 *
 * Layout (rowkernel.q4dot_block): per column block of DOT_BLK outputs, per group of Q4_GROUP inputs, one
 * record: d (DOT_BLK scales), m (DOT_BLK scales), then 4 chunks of 32 bytes, chunk c's byte 4 j + k
 * holding output j's code of input 8 c + k in its low nibble and of input 8 c + 4 + k in its high one:
 * each nibble plane of a chunk is the dot_block layout of a quad of inputs. The scales are float16
 * (Q4DOT16_BYTES: rows_matmul_q4dot16) where every d and m of the weight is one (a Q4_1 or Q4_0 GGUF's),
 * else float32 (Q4DOT_BYTES: rows_matmul_q4dot; a Q4_K file's products of two scales, a float weight's
 * minimum). Why: a one-row step streams every record from memory, and float16 scales make a record 160
 * bytes instead of 192, the Q4_1 file's own size; the values, so the bits, are the same either way.
 *
 * Exactness: the integer sums are exact, and each row's float arithmetic (two fmaf a group, groups in
 * order) is the same in every build and call, whatever the row count: `ar` == `verified` at int4. */
#define Q4DOT_BYTES (2 * DOT_BLK * (long)sizeof(float) + Q4_GROUP * DOT_BLK / 2)
#define Q4DOT16_BYTES (2 * DOT_BLK * 2L + Q4_GROUP * DOT_BLK / 2)

/* A float16's value (its bits h) as a float: exact, subnormals, infinities and NaN included. */
static inline float half_float(unsigned short h) {
    const unsigned sign = (unsigned)(h >> 15) << 31, e = h >> 10 & 31, f = h & 1023;
    union {
        unsigned u;
        float f;
    } v;
    if (e == 31)
        v.u = sign | 0x7F800000u | f << 13;
    else if (e)
        v.u = sign | (e + 112) << 23 | f << 13;
    else { /* zero or subnormal: f * 2^-24, exact in float32 */
        v.f = (float)f * 0x1p-24f;
        v.u |= sign;
    }
    return v.f;
}

/* R rows over NB adjacent column blocks of the int4 matmul (each block's records `groups` records on):
 * sums (NB, R, DOT_BLK), rows at stride `in / 4` quads; SC the bytes of a scale (4: float32, 2: float16),
 * so BYTES = 2 DOT_BLK SC + 128 a record. A row's 8 products of a group go to two chains (one dependent
 * vpdpbusd chain a row set the pace: its latency), added at the group's end; integer sums, the same
 * whatever the chains. Each output's float arithmetic is two fmaf a group, groups in order, whatever R
 * and NB. The records are prefetched Q4DOT_AHEAD records ahead into every cache level (a
 * non-temporal prefetch two records ahead left a one-row step at a fifth of the memory's speed). */
#define Q4DOT_AHEAD 4
#if defined(__AVX2__)
#if defined(__F16C__)
#define HALF8(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#else /* AVX2 without F16C (a forced build): the same values, converted one at a time */
static inline __m256 half8(const unsigned short *p) {
    float f[8];
    for (int i = 0; i < 8; i++) f[i] = half_float(p[i]);
    return _mm256_loadu_ps(f);
}
#define HALF8(p) half8((const unsigned short *)(p))
#endif
#define Q4DOT_SCALES(rec, SC)                                                                               \
    const __m256 d = SC == 2 ? HALF8(rec) : _mm256_loadu_ps((const float *)(rec));                          \
    const __m256 m = SC == 2 ? HALF8((rec) + 16) : _mm256_loadu_ps((const float *)(rec) + DOT_BLK);
#define Q4DOT_FN(NAME, R, NB, SC)                                                                           \
    static void NAME(const int *xq, const float *sx, const float *xs, long in, const unsigned char *w,     \
                     float *sums) {                                                                         \
        const long groups = in / Q4_GROUP, quads = in / 4, BYTES = 2 * DOT_BLK * SC + Q4_GROUP * DOT_BLK / 2; \
        const __m256i low = _mm256_set1_epi8(15);                                                           \
        __attribute__((unused)) const __m256i ones = _mm256_set1_epi16(1);                                  \
        __m256 acc[NB][R];                                                                                  \
        for (int b = 0; b < NB; b++)                                                                        \
            for (int r = 0; r < R; r++) acc[b][r] = _mm256_setzero_ps();                                    \
        for (long g = 0; g < groups; g++) {                                                                 \
            _Pragma("GCC unroll 8") for (int b = 0; b < NB; b++) {                                          \
                const unsigned char *rec = w + (b * groups + g) * BYTES;                                    \
                for (int k = 0; k < BYTES; k += 64) __builtin_prefetch(rec + Q4DOT_AHEAD * BYTES + k, 0, 3); \
                Q4DOT_SCALES(rec, SC)                                                                       \
                __m256i c[8];                                                                               \
                for (int k = 0; k < 4; k++) {                                                               \
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(rec + 2 * DOT_BLK * SC + 32 * k)); \
                    c[2 * k] = _mm256_and_si256(v, low), c[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low); \
                }                                                                                           \
                for (int r = 0; r < R; r++) {                                                               \
                    const int *xr = xq + r * quads + g * (Q4_GROUP / 4);                                    \
                    __m256i ch0 = DPBUSD(_mm256_setzero_si256(), c[0], _mm256_set1_epi32(xr[0]));           \
                    __m256i ch1 = DPBUSD(_mm256_setzero_si256(), c[1], _mm256_set1_epi32(xr[1]));           \
                    for (int k = 2; k < 8; k += 2) {                                                        \
                        ch0 = DPBUSD(ch0, c[k], _mm256_set1_epi32(xr[k]));                                  \
                        ch1 = DPBUSD(ch1, c[k + 1], _mm256_set1_epi32(xr[k + 1]));                          \
                    }                                                                                       \
                    const __m256i s = _mm256_add_epi32(ch0, ch1);                                           \
                    const float sxr = sx[r * groups + g];                                                   \
                    acc[b][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d, _mm256_set1_ps(sxr)), acc[b][r]); \
                    acc[b][r] = _mm256_fmadd_ps(m, _mm256_set1_ps(xs[r * groups + g]), acc[b][r]);          \
                }                                                                                           \
            }                                                                                               \
        }                                                                                                   \
        for (int b = 0; b < NB; b++)                                                                        \
            for (int r = 0; r < R; r++) _mm256_storeu_ps(sums + (b * R + r) * DOT_BLK, acc[b][r]);          \
    }
#else
#define Q4DOT_FN(NAME, R, NB, SC)                                                                           \
    static void NAME(const int *xq, const float *sx, const float *xs, long in, const unsigned char *w,     \
                     float *sums) {                                                                         \
        const long groups = in / Q4_GROUP, quads = in / 4, BYTES = 2 * DOT_BLK * SC + Q4_GROUP * DOT_BLK / 2; \
        for (int i = 0; i < NB * R * DOT_BLK; i++) sums[i] = 0.f;                                           \
        for (int b = 0; b < NB; b++)                                                                        \
            for (long g = 0; g < groups; g++) {                                                             \
                const unsigned char *rec = w + (b * groups + g) * BYTES, *codes = rec + 2 * DOT_BLK * SC;   \
                float d[DOT_BLK], m[DOT_BLK];                                                               \
                for (int j = 0; j < DOT_BLK; j++)                                                           \
                    d[j] = SC == 2 ? half_float(((const unsigned short *)rec)[j]) : ((const float *)rec)[j],\
                    m[j] = SC == 2 ? half_float(((const unsigned short *)rec)[DOT_BLK + j])                 \
                                   : ((const float *)rec)[DOT_BLK + j];                                     \
                for (int r = 0; r < R; r++) {                                                               \
                    const signed char *x = (const signed char *)(xq + r * quads) + g * Q4_GROUP;            \
                    for (int j = 0; j < DOT_BLK; j++) {                                                     \
                        int s = 0;                                                                          \
                        for (int i = 0; i < Q4_GROUP; i++)                                                  \
                            s += x[i] * ((codes[32 * (i / 8) + 4 * j + i % 4] >> (i % 8 / 4 * 4)) & 15);    \
                        float *y = sums + (b * R + r) * DOT_BLK + j;                                        \
                        *y = fmaf((float)s, d[j] * sx[r * groups + g], *y);                                 \
                        *y = fmaf(m[j], xs[r * groups + g], *y);                                            \
                    }                                                                                       \
                }                                                                                           \
            }                                                                                               \
    }
#endif
/* Blocks a call by rows (Q4DOT_NB): as many streams as the registers hold each block's 8 code vectors
 * and R sums (measured on SmolLM2's layers: docs/results-log.md), and one-block functions for the
 * blocks left over. */
#define Q4DOT_NB1 4 /* one row */
#define Q4DOT_NB2 4 /* two rows */
#define Q4DOT_NB4 2 /* three and four rows */
#define Q4DOT_NB9 1 /* five to nine rows */
static const long Q4DOT_NB[MAX_R + 1] = {0, Q4DOT_NB1, Q4DOT_NB2, Q4DOT_NB4, Q4DOT_NB4, Q4DOT_NB9,
                                         Q4DOT_NB9, Q4DOT_NB9, Q4DOT_NB9, Q4DOT_NB9};
#define Q4DOT_FNS(P, SC)                                                                                    \
    Q4DOT_FN(P##1, 1, Q4DOT_NB1, SC) Q4DOT_FN(P##2, 2, Q4DOT_NB2, SC) Q4DOT_FN(P##3, 3, Q4DOT_NB4, SC)       \
    Q4DOT_FN(P##4, 4, Q4DOT_NB4, SC) Q4DOT_FN(P##5, 5, Q4DOT_NB9, SC) Q4DOT_FN(P##6, 6, Q4DOT_NB9, SC)       \
    Q4DOT_FN(P##7, 7, Q4DOT_NB9, SC) Q4DOT_FN(P##8, 8, Q4DOT_NB9, SC) Q4DOT_FN(P##9, 9, Q4DOT_NB9, SC)       \
    Q4DOT_FN(P##1_1, 1, 1, SC) Q4DOT_FN(P##2_1, 2, 1, SC) Q4DOT_FN(P##3_1, 3, 1, SC) Q4DOT_FN(P##4_1, 4, 1, SC) \
    Q4DOT_FN(P##5_1, 5, 1, SC) Q4DOT_FN(P##6_1, 6, 1, SC) Q4DOT_FN(P##7_1, 7, 1, SC) Q4DOT_FN(P##8_1, 8, 1, SC) \
    Q4DOT_FN(P##9_1, 9, 1, SC)                                                                              \
    static const q4dot_fn P##N[MAX_R + 1] = {0, P##1, P##2, P##3, P##4, P##5, P##6, P##7, P##8, P##9};      \
    static const q4dot_fn P##1S[MAX_R + 1] = {0, P##1_1, P##2_1, P##3_1, P##4_1, P##5_1, P##6_1, P##7_1, P##8_1, P##9_1};
typedef void (*q4dot_fn)(const int *, const float *, const float *, long, const unsigned char *, float *);
Q4DOT_FNS(q4dot_, 4)
Q4DOT_FNS(q4dot16_, 2)

/* y (rows, out) = x (rows, in) quantized per group @ W.t(), W in rowkernel.q4dot_block's layout with
 * float32 (`half` 0, Q4DOT_BYTES records) or float16 scales (`half` 1, Q4DOT16_BYTES). */
static void matmul_q4dot(const float *x, long rows, long in, const unsigned char *w, float *y, long out, int threads,
                         int half) {
    const long quads = in / 4, groups = in / Q4_GROUP, blocks = (out + DOT_BLK - 1) / DOT_BLK;
    const q4dot_fn *fns = half ? q4dot16_N : q4dot_N, *single = half ? q4dot16_1S : q4dot_1S;
    const long bytes = half ? Q4DOT16_BYTES : Q4DOT_BYTES;
    int *xq = malloc(rows * quads * sizeof(int));
    float *sx = malloc(rows * groups * sizeof(float)), *xs = malloc(rows * groups * sizeof(float));
    quantize_groups(x, rows, in, Q4_GROUP, xq, sx, xs);
    DOT_PASSES_NB(float, Q4DOT_NB,
                  (n == 1 ? single : fns)[R](xq + r0 * quads, sx + r0 * groups, xs + r0 * groups, in,
                                           w + b * groups * bytes, sums),
                  sums[(k * R + r) * DOT_BLK + j])
    free(xq), free(sx), free(xs);
}

void rows_matmul_q4dot(const float *x, long rows, long in, const unsigned char *w, float *y, long out, int threads) {
    matmul_q4dot(x, rows, in, w, y, out, threads, 0);
}

void rows_matmul_q4dot16(const float *x, long rows, long in, const unsigned char *w, float *y, long out, int threads) {
    matmul_q4dot(x, rows, in, w, y, out, threads, 1);
}

int rows_q4dot_bytes(void) { return Q4DOT_BYTES; }
int rows_q4dot16_bytes(void) { return Q4DOT16_BYTES; }

/* ---- The same for 8-bit codes: a GGUF's Q8_0 table (SmolLM2's tied head), code * d per group ----
 *
 * Why: greedy steps choose through the head's int8 screen, but a sampling or `hybrid` step needs every
 * logit, and the float32 head is 113 MB (49,152 x 576) streamed each step: more than the 4-bit layers'
 * 80. Its values are the GGUF's Q8_0 table dequantized: code * d per group of 32 inputs, code in
 * -127..127 and d a float16 value, so code * d is exact in float32 (8 bits by 11), and this loop,
 * rebuilding each weight and running rows_matmul's fmaf chain on it, gives rows_matmul's bits from
 * 1.125 bytes a weight.
 *
 * Layout (rowkernel.q8_block): per column block of BLK outputs, per group of Q8_GROUP inputs, one
 * contiguous Q8_GROUP_BYTES record: d (BLK floats), then per input BLK int8 codes (outputs in order). */
#define Q8_GROUP Q4_GROUP /* the GGUF's blocks of 32 inputs, as Q4_1's */
#define Q8_GROUP_BYTES (BLK * (long)sizeof(float) + Q8_GROUP * BLK)
#define PREFETCH_Q8 2304 /* bytes ahead: two groups' records */

/* The 8-bit row: d vectors per group; per input, each vector of codes widened. */
#define Q8_ROW_SETUP                                                                                        \
    vf dv[VB];                                                                                              \
    for (int v = 0; v < VB; v++) dv[v] = *(const vf *)((const float *)rec + v * LANES);
#define Q8_ROW_REBUILD                                                                                      \
    const signed char *wi = (const signed char *)rec + BLK * sizeof(float) + i * BLK;                       \
    __builtin_prefetch(wi + PREFETCH_Q8, 0, 3);                                                             \
    for (int v = 0; v < VB; v++) wv[v] = widen(wi + v * LANES) * dv[v];

/* The 8-bit pair: its d vectors per group; per input, two vectors of codes widened. */
#define Q8_SETUP                                                                                            \
    const float *d = (const float *)rec + p * 2 * LANES;                                                    \
    const vf d0 = *(const vf *)d, d1 = *(const vf *)(d + LANES);                                            \
    const signed char *codes = (const signed char *)rec + BLK * sizeof(float) + p * 2 * LANES;
#define Q8_REBUILD                                                                                          \
    __builtin_prefetch(codes + i * BLK + PREFETCH_Q8, 0, 3);                                                \
    w0 = widen(codes + i * BLK) * d0, w1 = widen(codes + i * BLK + LANES) * d1;

/* An 8-bit codes matmul with groups of GROUP inputs (records of GROUP_BYTES), its pair functions made by
 * PAIRS_FN (NAME, R): the one-row and 2-9-row functions, their table, and
 * void rows_matmul_P(x, rows, in, w, y, out, threads): y (rows, out) = x (rows, in) @ W.t(), W in the
 * family's layout (in a multiple of GROUP). Q8 (groups of 32) and Q6 (of 16) differ only in the group. */
#define CODES8_MATMUL(P, GROUP, GROUP_BYTES, PAIRS_FN)                                                      \
    CODES_ONE_ROW_FN(P##_one_row, GROUP, GROUP_BYTES, Q8_ROW_SETUP, Q8_ROW_REBUILD)                         \
    PAIRS_FN(P##_pairs_2, 2)                                                                                \
    PAIRS_FN(P##_pairs_3, 3)                                                                                \
    PAIRS_FN(P##_pairs_4, 4)                                                                                \
    PAIRS_FN(P##_pairs_5, 5)                                                                                \
    PAIRS_FN(P##_pairs_6, 6)                                                                                \
    PAIRS_7_TO_9(PAIRS_FN, P##_pairs_)                                                                      \
    static const q4_block_fn P##_blocks[PAIR_MAX_R + 1] = {                                                 \
        0, P##_one_row, P##_pairs_2, P##_pairs_3, P##_pairs_4, P##_pairs_5, P##_pairs_6                     \
        PAIRS_7_TO_9_LIST(P##_pairs_)};                                                                     \
    void rows_matmul_##P(const float *x, long rows, long in, const unsigned char *w, float *y, long out,    \
                         int threads) {                                                                     \
        MATMUL_PASSES(P##_blocks, P##_blocks, Q4_STREAMS, PAIR_MAX_R, in / GROUP * GROUP_BYTES)             \
    }

#define Q8_PAIRS_FN(NAME, R) CODES_PAIRS_FN(NAME, R, Q8_GROUP, Q8_GROUP_BYTES, Q8_SETUP, Q8_REBUILD)
CODES8_MATMUL(q8, Q8_GROUP, Q8_GROUP_BYTES, Q8_PAIRS_FN)

/* Whether n values (stride si) are codes * d for this d, codes in -127..127 (written at stride BLK): each
 * value's code round(w / d), and (float)code * d must give the value back exactly. */
static int codes_fit(const float *wj, long si, int n, float d, signed char *codes) {
    for (int i = 0; i < n; i++) {
        const float t = d != 0.f ? wj[i * si] / d : 0.f;
        if (!(t > -127.5f && t < 127.5f)) return 0; /* NaN fails too */
        const int c = (int)lrintf(t);
        if ((float)c * d != wj[i * si]) return 0;
        codes[i * BLK] = (signed char)c;
    }
    return 1;
}

/* The largest |w| of n values at stride si. */
static float group_top(const float *wj, long si, int n) {
    float top = 0.f;
    for (int i = 0; i < n; i++) top = fabsf(wj[i * si]) > top ? fabsf(wj[i * si]) : top;
    return top;
}

/* One group of an output (Q8_GROUP values at stride si) as codes * d (codes_fit), d a float16 value in
 * one of two forms: a GGUF's Q8_0 (d its largest |w| / 127, codes -127..127) and a GGUF's Q5_0 ((q - 16)
 * * d, q in 0..31: llama.cpp's quantizer puts the value of largest magnitude at q = 0, so |d| is that
 * value / 16, and the codes, -16..16 once the sign is d's, are 8-bit codes as well: llama.cpp's Q4_K_M
 * writes Q5_0 where a row is not a multiple of 256, most of Gemma 3 270M's layers). Writes d and the
 * codes, returns 0, or 1 where neither fits. */
static int q8_group(const float *wj, long si, int n, float *d_out, signed char *codes) {
    const float top = group_top(wj, si, n);
    for (int k = 0; k < 2; k++) {
        const float d = half_round(top / (k ? 16.f : 127.f));
        if (codes_fit(wj, si, n, d, codes)) return *d_out = d, 0;
    }
    return 1;
}

/* W (out, in) float32 at strides (so, si), in a multiple of `group`, into a codes layout at dst (ceil(out /
 * BLK) x in / group records of `bytes`: d (BLK floats), then per input BLK int8 codes; zeroed by the
 * caller), each group of an output as `fit` finds its d and codes. Returns 0, or 1 as soon as a group
 * has none, so a weight either gives its exact bits back or is refused. */
static int codes_pack(const float *w, long out, long in, long so, long si, unsigned char *dst, int group,
                      long bytes, int (*fit)(const float *, long, int, float *, signed char *), int threads) {
    const long groups = in / group, blocks = (out + BLK - 1) / BLK;
    int refused = 0;
#pragma omp parallel for schedule(dynamic) num_threads(threads) if (threads > 1 && blocks > 1)
    for (long b = 0; b < blocks; b++) { /* each block's records its own, as in rows_q4_pack */
        const long n = out - b * BLK < BLK ? out - b * BLK : BLK;
        int stop;
#pragma omp atomic read
        stop = refused;
        for (long g = 0; g < groups && !stop; g++) {
            unsigned char *rec = dst + (b * groups + g) * bytes;
            signed char *codes = (signed char *)rec + BLK * sizeof(float);
            for (long j = 0; j < n && !stop; j++)
                stop = fit(w + (b * BLK + j) * so + g * group * si, si, group, (float *)rec + j, codes + j);
        }
        if (stop) {
#pragma omp atomic write
            refused = 1;
        }
    }
    return refused;
}

/* W into rows_matmul_q8's layout (codes_pack with q8_group), in a multiple of Q8_GROUP. */
int rows_q8_pack(const float *w, long out, long in, long so, long si, unsigned char *dst, int threads) {
    return codes_pack(w, out, in, so, si, dst, Q8_GROUP, Q8_GROUP_BYTES, q8_group, threads);
}

int rows_q8_bytes(void) { return Q8_GROUP_BYTES; }

/* ---- The same with a scale per 16 inputs: a GGUF's Q6_K tensors (most of a Q4_K_M file's ffn_down) ----
 *
 * Why: a Q6_K value is (d * sc) * q, d a float16 value per 256 inputs, sc an int8 scale per 16 and q a
 * 6-bit code (-32..31): d * sc is exact in float32 (11 bits by 8), so each value is one rounding of a
 * scale per 16 inputs times a small integer. Two scales a group of 32 do not fit rows_matmul_q8's one,
 * and held as float32 these weights were the float32 share of Gemma 3 270M's step (docs/results-log.md);
 * as 8-bit codes with a scale per 16 inputs (1.25 bytes a weight) the same rebuild (code * d, one
 * rounding) and fmaf chain give rows_matmul's bits.
 *
 * Layout (rowkernel.q6_block): rows_matmul_q8's with groups of Q6_GROUP inputs: per column block, per
 * group, d (BLK floats), then per input BLK int8 codes (outputs in order). */
#define Q6_GROUP 16
#define Q6_GROUP_BYTES (BLK * (long)sizeof(float) + Q6_GROUP * BLK)
#define Q6_PAIRS_FN(NAME, R) CODES_PAIRS_FN(NAME, R, Q6_GROUP, Q6_GROUP_BYTES, Q8_SETUP, Q8_REBUILD)
CODES8_MATMUL(q6, Q6_GROUP, Q6_GROUP_BYTES, Q6_PAIRS_FN)

/* One group of an output (Q6_GROUP values at stride si) as codes * d (codes_fit): d is the group's
 * largest |w| over its code's magnitude, which a Q6_K group's codes put at 1..32, so each is tried,
 * with d's float32 neighbours (the division's rounding). Writes d and the codes, returns 0, or 1 where
 * no d fits. */
static int q6_group(const float *wj, long si, int n, float *d_out, signed char *codes) {
    const float top = group_top(wj, si, n);
    if (top == 0.f) return *d_out = 0.f, !codes_fit(wj, si, n, 0.f, codes);
    for (int q = 32; q >= 1; q--) {
        const float d = top / q, tries[3] = {d, nextafterf(d, 0.f), nextafterf(d, INFINITY)};
        for (int k = 0; k < 3; k++)
            if (codes_fit(wj, si, n, tries[k], codes)) return *d_out = tries[k], 0;
    }
    return 1;
}

/* W into rows_matmul_q6's layout (codes_pack with q6_group), in a multiple of Q6_GROUP. */
int rows_q6_pack(const float *w, long out, long in, long so, long si, unsigned char *dst, int threads) {
    return codes_pack(w, out, in, so, si, dst, Q6_GROUP, Q6_GROUP_BYTES, q6_group, threads);
}

int rows_q6_bytes(void) { return Q6_GROUP_BYTES; }
int rows_q6_group(void) { return Q6_GROUP; }

/* ---- The LM head's greedy choice: an integer screen, then exact float32 logits where it leaves doubt ----
 *
 * Why: the head is a fifth of a float32 step's bytes (SmolLM2: 49,152 x 576 floats, 113 MB streamed every
 * step), yet a greedy step needs only its largest logit. The screen reads the head as int8 codes, a
 * quarter of the bytes, in integer dot products (each extra verifying row costs its products, as in
 * the int4 layers), and computes, for the few tokens whose screened logit could still be the largest
 * (yue/kernels/screen.py derives the bound), the float32 logit exactly as rows_matmul does: one fmaf
 * chain over the inputs in order from 0, so the same bits.
 *
 * The screened logit of token j for a row x: x quantized to 16-bit integers xq (symmetric, scale
 * sx = max |x| / XQ_MAX); the head's int8 codes q with a float scale d per group of Q4_GROUP inputs (a
 * GGUF Q8_0 head's own codes and scales: screen.py), widened to 16 bits as they are read; per group the
 * exact integer S = xq . q (pairs of 16-bit products summed into 32 bits: one vpdpwssd with VNNI, else
 * pmaddwd and an add), then the sum over groups of S d in float (one fmaf a group, in order), times sx
 * in double. Why 16 bits and not 8: a hidden state's few outlier channels set max |x|, and 8-bit
 * activations left a bound that kept thousands of candidates a row (docs/results-log.md).
 *
 * Layout (screen.screen_block): per column block of DOT_BLK tokens, per group, one
 * SCREEN_BYTES record: d (DOT_BLK floats), then per pair of the group's inputs each token's 2 codes
 * side by side (token j's at bytes 2 j, 2 j + 1: one 32-bit lane once widened), inputs zero-padded to
 * whole groups.
 *
 * Exactness: the integer sums are exact and the float arithmetic the same in every build (the plain
 * loop computes the same values), so every build keeps the same candidates; the argmax's exactness
 * rests on the bound alone. */
#define XQ_MAX 32767 /* the rows' integers: int16's range, symmetric */
#define SCREEN_BYTES (DOT_BLK * (long)sizeof(float) + Q4_GROUP * DOT_BLK)
#define SCREEN_PAIRS (Q4_GROUP / 2) /* pairs of inputs a group */

/* R rows over NB adjacent column blocks of the screen (each block `pairs / SCREEN_PAIRS` records on):
 * sums (NB, R, DOT_BLK) = per token sum_g fl(S_g) d_g, in order. xd: the rows' 16-bit integers, per
 * pair of inputs (at stride `stride` ints) each row's pair as one int, so that one pointer reaches every
 * row's. NB blocks at once are NB memory streams (DOT_PASSES_NB), prefetched SCREEN_AHEAD records
 * ahead into every cache level. */
#define SCREEN_AHEAD 4
#if defined(__AVX2__)
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define DPWSSD(acc, a, b) _mm256_dpwssd_epi32(acc, a, b)
#elif defined(__AVXVNNI__)
#define DPWSSD(acc, a, b) _mm256_dpwssd_avx_epi32(acc, a, b)
#else
#define DPWSSD(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
#endif
/* Each row's integer sums of a group in CH chains (one dependent vpdpwssd chain was the one-row
 * screen's pace: its latency, not the memory): a pair's two products go to chains 2 i % CH and
 * (2 i + 1) % CH, added at the group's end. Integer sums: the same S whatever the chains. */
#define SCREEN_FN(NAME, R, CH, NB)                                                                          \
    static void NAME(const int *xd, long stride, long pairs, const unsigned char *w, float *sums) {         \
        const long groups = pairs / SCREEN_PAIRS;                                                           \
        __m256 acc[NB][R];                                                                                  \
        for (int b = 0; b < NB; b++)                                                                        \
            for (int r = 0; r < R; r++) acc[b][r] = _mm256_setzero_ps();                                    \
        for (long g = 0; g < groups; g++) {                                                                 \
            _Pragma("GCC unroll 8") for (int b = 0; b < NB; b++) {                                          \
                const unsigned char *rec = w + (b * groups + g) * SCREEN_BYTES;                             \
                for (int k = 0; k < SCREEN_BYTES; k += 64)                                                  \
                    __builtin_prefetch(rec + SCREEN_AHEAD * SCREEN_BYTES + k, 0, 3);                        \
                __m256i s[R][CH];                                                                           \
                for (int r = 0; r < R; r++)                                                                 \
                    for (int c = 0; c < CH; c++) s[r][c] = _mm256_setzero_si256();                          \
                _Pragma("GCC unroll 16") for (int p = 0; p < SCREEN_PAIRS; p += 2) {                        \
                    const __m256i two = _mm256_loadu_si256((const __m256i *)(rec + DOT_BLK * sizeof(float) + 2 * DOT_BLK * p)); \
                    const __m256i c0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(two));                  \
                    const __m256i c1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(two, 1));              \
                    const int *x0 = xd + (g * SCREEN_PAIRS + p) * stride, *x1 = x0 + stride;                \
                    const int k0 = p % CH, k1 = (p + 1) % CH;                                               \
                    for (int r = 0; r < R; r++) {                                                           \
                        s[r][k0] = DPWSSD(s[r][k0], c0, _mm256_set1_epi32(x0[r]));                          \
                        s[r][k1] = DPWSSD(s[r][k1], c1, _mm256_set1_epi32(x1[r]));                          \
                    }                                                                                       \
                }                                                                                           \
                const __m256 d = _mm256_loadu_ps((const float *)rec);                                       \
                for (int r = 0; r < R; r++) {                                                               \
                    __m256i total = s[r][0];                                                                \
                    for (int c = 1; c < CH; c++) total = _mm256_add_epi32(total, s[r][c]);                  \
                    acc[b][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), d, acc[b][r]);                   \
                }                                                                                           \
            }                                                                                               \
        }                                                                                                   \
        for (int b = 0; b < NB; b++)                                                                        \
            for (int r = 0; r < R; r++) _mm256_storeu_ps(sums + (b * R + r) * DOT_BLK, acc[b][r]);          \
    }
#else
#define SCREEN_FN(NAME, R, CH, NB)                                                                          \
    static void NAME(const int *xd, long stride, long pairs, const unsigned char *w, float *sums) {         \
        const long groups = pairs / SCREEN_PAIRS;                                                           \
        for (int b = 0; b < NB; b++)                                                                        \
            for (int r = 0; r < R; r++)                                                                     \
                for (int j = 0; j < DOT_BLK; j++) {                                                         \
                    float acc = 0.f;                                                                        \
                    for (long g = 0; g < groups; g++) {                                                     \
                        const unsigned char *rec = w + (b * groups + g) * SCREEN_BYTES;                     \
                        const signed char *q = (const signed char *)rec + DOT_BLK * sizeof(float);          \
                        int s = 0;                                                                          \
                        for (int p = 0; p < SCREEN_PAIRS; p++) {                                            \
                            const short *x = (const short *)(xd + (g * SCREEN_PAIRS + p) * stride + r);     \
                            s += x[0] * q[2 * DOT_BLK * p + 2 * j] + x[1] * q[2 * DOT_BLK * p + 2 * j + 1]; \
                        }                                                                                   \
                        acc = fmaf((float)s, ((const float *)rec)[j], acc);                                 \
                    }                                                                                       \
                    sums[(b * R + r) * DOT_BLK + j] = acc;                                                  \
                }                                                                                           \
    }
#endif
/* Blocks a call by rows, as Q4DOT_NB; chains: rows x CH x NB within the registers. */
static const long SCREEN_NB[MAX_R + 1] = {0, 4, 2, 2, 2, 1, 1, 1, 1, 1};
SCREEN_FN(screen_1, 1, 2, 4)
SCREEN_FN(screen_2, 2, 2, 2)
SCREEN_FN(screen_3, 3, 1, 2)
SCREEN_FN(screen_4, 4, 1, 2)
SCREEN_FN(screen_5, 5, 1, 1)
SCREEN_FN(screen_6, 6, 1, 1)
SCREEN_FN(screen_7, 7, 1, 1)
SCREEN_FN(screen_8, 8, 1, 1)
SCREEN_FN(screen_9, 9, 1, 1)
SCREEN_FN(screen_1_1, 1, 4, 1)
SCREEN_FN(screen_2_1, 2, 2, 1)
SCREEN_FN(screen_3_1, 3, 2, 1)
SCREEN_FN(screen_4_1, 4, 2, 1)
typedef void (*screen_fn)(const int *, long, long, const unsigned char *, float *);
static const screen_fn SCREENS[MAX_R + 1] = {0, screen_1, screen_2, screen_3, screen_4, screen_5, screen_6, screen_7, screen_8, screen_9};
static const screen_fn SCREENS_1[MAX_R + 1] = {0, screen_1_1, screen_2_1, screen_3_1, screen_4_1, screen_5,
                                               screen_6, screen_7, screen_8, screen_9};

/* A row x (in floats) as the screen's 16-bit integers, input i's at xq[i / 2 * stride + i % 2] (the
 * caller's zero padding left as it is); its scale *sx, and what the bound reads of it:
 * *n1 = |x|_1 + |delta|_1 and *n2 = |delta|_2, delta = x - sx xq (in double: sx xq is exact there).
 * Returns 1 where a value is not finite. The bound holds for any xq; rounding to nearest makes it small. */
static int screen_row(const float *x, long in, short *xq, long stride, float *sx, double *n1, double *n2) {
    float amax = 0.f;
    double l1 = 0.0, d1 = 0.0, d2 = 0.0;
    for (long i = 0; i < in; i++) {
        const float a = fabsf(x[i]);
        if (!(a < INFINITY)) return 1; /* inf or NaN */
        amax = a > amax ? a : amax, l1 += a;
    }
    const float s = amax / XQ_MAX, inv = amax > 0.f && XQ_MAX / amax < INFINITY ? XQ_MAX / amax : 0.f;
    for (long i = 0; i < in; i++) {
        const float t = nearbyintf(x[i] * inv);
        const int q = t > XQ_MAX ? XQ_MAX : t < -XQ_MAX ? -XQ_MAX : (int)t;
        xq[i / 2 * stride + i % 2] = (short)q;
        const double delta = (double)x[i] - (double)s * q;
        d1 += fabs(delta), d2 += delta * delta;
    }
    *sx = s, *n1 = l1 + d1, *n2 = sqrt(d2);
    return 0;
}

/* The bound's two passes over a row's screened sums y (out floats; y sx is A_j): the floor M = max_j
 * (A_j - r_j), then the tokens with A_j + r_j >= M, r_j = n1 slack[j] + n2 wnorm[j]. Each value is one
 * fused rounding in double (r_j = fma(n1, slack, n2 wnorm), A_j -/+ r_j = fma(y, sx, -/+ r_j)), so
 * the AVX512 loops and the plain ones agree bit for bit and every build keeps the same candidates (the
 * bound's margin, WIDEN in screen.py, covers these roundings). Why vectors: with one candidate a row
 * (the usual case, e_j = 0), these two passes over the 49k tokens were a sizeable share of the screen. */
static inline double screen_radius(double n1, double n2, double slack, double wnorm) {
    return fma(n1, slack, n2 * wnorm);
}

#if defined(__AVX512F__)
/* screen_radius of the 8 tokens at slack, wnorm, with the same roundings. */
static inline __m512d screen_radius8(double n1, double n2, const double *slack, const double *wnorm) {
    return _mm512_fmadd_pd(_mm512_set1_pd(n1), _mm512_loadu_pd(slack),
                           _mm512_mul_pd(_mm512_set1_pd(n2), _mm512_loadu_pd(wnorm)));
}
#endif

static double screen_floor(const float *y, long out, double sx, double n1, double n2, const double *slack,
                           const double *wnorm) {
    double floor = -INFINITY;
    long j = 0;
#if defined(__AVX512F__)
    const __m512d s = _mm512_set1_pd(sx);
    __m512d best = _mm512_set1_pd(-INFINITY);
    for (; j + 8 <= out; j += 8) {
        const __m512d rad = screen_radius8(n1, n2, slack + j, wnorm + j);
        best = _mm512_max_pd(best, _mm512_fmsub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(y + j)), s, rad));
    }
    floor = _mm512_reduce_max_pd(best); /* no NaN: the rows are finite */
#endif
    for (; j < out; j++) {
        const double low = fma((double)y[j], sx, -screen_radius(n1, n2, slack[j], wnorm[j]));
        floor = low > floor ? low : floor;
    }
    return floor;
}

/* Whether token j may be the row's largest (A_j + r_j >= floor), as screen_floor rounds it. */
static inline int screen_keeps(float y, double sx, double n1, double n2, double slack, double wnorm, double floor) {
    return fma((double)y, sx, screen_radius(n1, n2, slack, wnorm)) >= floor;
}

/* Where none of the 8 tokens at y (n of them left) is a candidate (screen_keeps, in one vector): set
 * them to -inf (their screened values to `seen`, if given) and return 1; else (or with fewer than 8
 * left, or no AVX512) 0, touching nothing. */
static inline int screen_none(float *y, long n, double sx, double n1, double n2, const double *slack,
                              const double *wnorm, double floor, float *seen) {
#if defined(__AVX512F__)
    if (n < 8) return 0;
    const __m512d yv = _mm512_cvtps_pd(_mm256_loadu_ps(y)), s = _mm512_set1_pd(sx);
    const __m512d rad = screen_radius8(n1, n2, slack, wnorm);
    if (_mm512_cmp_pd_mask(_mm512_fmadd_pd(yv, s, rad), _mm512_set1_pd(floor), _CMP_GE_OQ)) return 0;
    if (seen) _mm256_storeu_ps(seen, _mm512_cvtpd_ps(_mm512_mul_pd(yv, s)));
    _mm256_storeu_ps(y, _mm256_set1_ps(-INFINITY));
    return 1;
#else
    (void)y, (void)n, (void)sx, (void)n1, (void)n2, (void)slack, (void)wnorm, (void)floor, (void)seen;
    return 0;
#endif
}

/* y (rows, out): each row's float32 logits where they may be its largest, -inf elsewhere (the screen of
 * yue/kernels/screen.py, whose docstring derives the bound). x (rows, in) row-major; codes the head's
 * codes and scales in screen.screen_block's layout; the bound's radius of token j is
 * n1 slack[j] + n2 wnorm[j] (screen_row's n1, n2); w the float32 head (out, in) at strides (sc, si),
 * e.g. a tied head's input-major storage (sc 1, si out): a kept logit is one fmaf chain over the inputs
 * in order from 0, rows_matmul's bits. The bound's arithmetic is in double. Returns 1 (y undefined)
 * where a row is not finite, else 0. entropy (rows floats, or NULL): each row's softmax entropy over its
 * logits as screened, the kept ones exact and the rest their screened values (within the bound of
 * theirs): what the router reads of the AR path (yue/model/router.py) without streaming the whole head
 * again for that row. */
int rows_screen(const float *x, long rows, long in, const unsigned char *codes, const double *slack,
                const double *wnorm, const float *w, long sc, long si, float *y, long out, float *entropy,
                int threads) {
    const long groups = (in + Q4_GROUP - 1) / Q4_GROUP, pairs = groups * SCREEN_PAIRS;
    const long blocks = (out + DOT_BLK - 1) / DOT_BLK;
    int *xd = calloc(pairs * rows, sizeof(int)); /* (pairs, rows) pairs of 16-bit integers: screen_row's */
    float *sx = malloc(rows * sizeof(float));
    double *n1 = malloc(rows * sizeof(double)), *n2 = malloc(rows * sizeof(double));
    float *seen = entropy ? malloc(out * sizeof(float)) : NULL; /* a row's logits as screened, for its entropy */
    int failed = 0;
    for (long r = 0; r < rows && !failed; r++)
        failed = screen_row(x + r * in, in, (short *)(xd + r), 2 * rows, sx + r, n1 + r, n2 + r);
    if (!failed) {
        DOT_PASSES_NB(float, SCREEN_NB,
                      (n == 1 ? SCREENS_1 : SCREENS)[R](xd + r0, rows, pairs, codes + b * groups * SCREEN_BYTES, sums),
                      sums[(k * R + r) * DOT_BLK + j])
    }
    for (long r = 0; r < rows && !failed; r++) {
        const float *xr = x + r * in;
        float *yr = y + r * out;
        const double floor = screen_floor(yr, out, sx[r], n1[r], n2[r], slack, wnorm);
        for (long j = 0; j < out; j++) {
            if (j % 8 == 0 && screen_none(yr + j, out - j, sx[r], n1[r], n2[r], slack + j, wnorm + j, floor,
                                          seen ? seen + j : NULL)) {
                j += 7; /* 8 tokens, none a candidate: done at once */
                continue;
            }
            const double screened = (double)yr[j] * sx[r];
            if (!screen_keeps(yr[j], sx[r], n1[r], n2[r], slack[j], wnorm[j], floor)) {
                if (seen) seen[j] = (float)screened;
                yr[j] = -INFINITY;
                continue;
            }
            const float *b = w + j * sc;
            float acc = 0.f;
            for (long i = 0; i < in; i++) acc = fmaf(xr[i], b[i * si], acc);
            yr[j] = acc;
            if (seen) seen[j] = acc;
        }
        if (seen) {
            float top;
            softmax_row(seen, out, &top, entropy + r);
        }
    }
    free(xd), free(sx), free(n1), free(n2), free(seen);
    return failed;
}

int rows_screen_bytes(void) { return SCREEN_BYTES; }

/* ---- Matmuls on a GGUF's blocks as the file stores them (ggml/common.h says how) ---- */
#include "ggml/common.h"
#include "ggml/kquants.h"
#include "ggml/blocks32.h"
#include "ggml/float.c"
#include "ggml/q4_0.c"
#include "ggml/q4_1.c"
#include "ggml/q5_0.c"
#include "ggml/q8_0.c"
#include "ggml/q4_k.c"
#include "ggml/q5_k.c"
#include "ggml/q6_k.c"
#include "ggml/dispatch.c"

/* ---- A GGUF's Q4_1 and Q8_0 rows straight into rows_matmul_q4's and rows_matmul_q8's records ----
 *
 * Why: the float32 and int4 precisions hold a Q4_1 file's layers (yue-smol's) and a Q8_0 table as these
 * records, whose codes are the file's. Dequantizing every matrix to float32 first and packing it back
 * (rows_q4_pack, rows_q8_pack) was most of a load. Each group's record here is the one those packers
 * write for the group's dequantized values, byte for byte (a test compares): the packers' form, found
 * from the block's own d, m and the codes it uses (at most 16 distinct values to check, not 32), and
 * where a group is not in that form (a degenerate or hand-made block), its 32 values dequantized as
 * gguf.quants does (q4_1_dequant, q8_0_dequant) and given to the packers' own search. */

/* A 32-block's scale(s) and codes, read plainly (the matmuls' decoders fill vector registers instead):
 * value d q[e] + m (Q4_1) or d sq[e] (Q8_0). */
struct block32_codes {
    unsigned char q[Q32];
    signed char sq[Q32];
    float d, m;
};

static void q4_1_codes(const unsigned char *blk, struct block32_codes *k) {
    k->d = half_at(blk), k->m = half_at(blk + 2);
    for (int l = 0; l < 16; l++) k->q[l] = blk[4 + l] & 15, k->q[16 + l] = blk[4 + l] >> 4;
}

static void q8_0_codes(const unsigned char *blk, struct block32_codes *k) {
    k->d = half_at(blk), k->m = 0.f;
    for (int e = 0; e < Q32; e++) k->sq[e] = (signed char)blk[2 + e], k->q[e] = (unsigned char)abs(k->sq[e]);
}

/* Output j's group of a Q4_1 block in q4_group_form's form for its dequantized values: d, m and the codes
 * c (bytes). 0, or 1 where the group has none. */
static NO_CONTRACT int q4_1_form(const unsigned char *blk, float *d_out, float *m_out, unsigned char *c) {
    struct block32_codes k;
    q4_1_codes(blk, &k);
    int used = 0, lo_q = 15, hi_q = 0;
    for (int e = 0; e < Q32; e++) used |= 1 << k.q[e], lo_q = k.q[e] < lo_q ? k.q[e] : lo_q, hi_q = k.q[e] > hi_q ? k.q[e] : hi_q;
    if (k.d > 0.f && k.d < INFINITY) { /* values rise with the code: the extremes are lo_q's and hi_q's */
        float v[16]; /* q4_1_dequant's values, unfused: d q, then + m */
        for (int q = 0; q < 16; q++) v[q] = k.d * (float)q + k.m;
        const float lo = v[lo_q], d = half_round((v[hi_q] - lo) / 15.f), inv = d != 0.f ? 1.f / d : 0.f;
        int map[16], bad = 0, moved = 0; /* q4_group_codes' checks, once per code value (unused ones do not count) */
        for (int q = 0; q < 16; q++) {
            const float t = (v[q] - lo) * inv;
            const int in = t > -0.5f && t < 15.5f;
            map[q] = in ? (int)(t + 0.5f) : 0;
            bad |= (!in || fmaf((float)map[q], d, lo) != v[q]) << q;
            moved |= (map[q] != q) << q;
        }
        if (!(bad & used) && bits_round(d, K_BITS) == d) {
            for (int e = 0; e < Q32; e++) c[e] = (unsigned char)(moved & used ? map[k.q[e]] : k.q[e]);
            return *d_out = d, *m_out = lo, 0;
        }
    }
    float wg[Q32];
    int ci[Q32];
    q4_1_dequant(blk, wg);
    if (q4_group_form(wg, d_out, m_out, ci)) return 1;
    for (int e = 0; e < Q32; e++) c[e] = (unsigned char)ci[e];
    return 0;
}

/* `out` rows of Q4_1 blocks (in / 32 a row, as the file stores them) into rows_matmul_q4's layout at dst
 * (zeroed by the caller): rows_q4_pack's bytes for their dequantized values. 0, or 1 where a group has
 * no form (rows_q4_pack's refusal). Column blocks on `threads` threads, each its own records; a record's
 * code bytes are written whole (the pair of outputs sharing a byte: q4_record_put's nibbles). */
int rows_q4_pack_q4_1(const unsigned char *w, long out, long in, unsigned char *dst, int threads) {
    const long groups = in / Q4_GROUP, blocks = (out + BLK - 1) / BLK, row = groups * Q4_1_BYTES;
    int refused = 0;
#pragma omp parallel for schedule(dynamic) num_threads(threads) if (threads > 1 && blocks > 1)
    for (long b = 0; b < blocks; b++) {
        const long n = out - b * BLK < BLK ? out - b * BLK : BLK;
        int bad = 0;
        for (long g = 0; g < groups && !bad; g++) {
            unsigned char *rec = dst + (b * groups + g) * Q4_GROUP_BYTES, c[BLK][Q32];
            memset(c, 0, sizeof c);
            for (long j = 0; j < n && !bad; j++)
                bad = q4_1_form(w + (b * BLK + j) * row + g * Q4_1_BYTES, (float *)rec + j, (float *)rec + BLK + j, c[j]);
            unsigned char *codes = rec + 2 * BLK * sizeof(float);
            for (int i = 0; i < Q32; i++)
                for (int pair = 0; pair < BLK / (2 * LANES); pair++)
                    for (int l = 0; l < LANES; l++)
                        codes[i * (BLK / 2) + pair * LANES + l] =
                            (unsigned char)(c[pair * 2 * LANES + l][i] | c[pair * 2 * LANES + LANES + l][i] << 4);
        }
        if (bad) {
#pragma omp atomic write
            refused = 1;
        }
    }
    return refused;
}

/* A Q8_0 block's d and codes for output j (q8_group's result on its dequantized values): 0, or 1. The
 * block's own form is q8_group's first where d is nonzero and finite and half_round(max |w| / 127) gives
 * d back: then every value q d is exact (8 bits by 11), so each code's round(w / d) is q. */
static int q8_0_record(const unsigned char *blk, float *d_out, signed char *codes) {
    struct block32_codes k;
    q8_0_codes(blk, &k);
    int top_q = 0;
    for (int e = 0; e < Q32; e++) top_q = k.q[e] > top_q ? k.q[e] : top_q;
    const float top = (float)top_q * fabsf(k.d); /* max |q d|: |q| d rounds as q d does, exact anyway */
    if (k.d != 0.f && fabsf(k.d) < INFINITY && half_round(top / 127.f) == k.d) {
        for (int e = 0; e < Q32; e++) codes[e * BLK] = k.sq[e];
        return *d_out = k.d, 0;
    }
    float wg[Q32];
    q8_0_dequant(blk, wg);
    return q8_group(wg, 1, Q32, d_out, codes);
}

/* `out` rows of Q8_0 blocks into rows_matmul_q8's layout at dst (zeroed by the caller): rows_q8_pack's
 * bytes for their dequantized values. 0, or 1 where a group has no form. */
int rows_q8_pack_q8_0(const unsigned char *w, long out, long in, unsigned char *dst, int threads) {
    const long groups = in / Q8_GROUP, blocks = (out + BLK - 1) / BLK, row = groups * Q8_0_BYTES;
    int refused = 0;
#pragma omp parallel for schedule(dynamic) num_threads(threads) if (threads > 1 && blocks > 1)
    for (long b = 0; b < blocks; b++) {
        const long n = out - b * BLK < BLK ? out - b * BLK : BLK;
        int bad = 0;
        for (long g = 0; g < groups && !bad; g++) {
            unsigned char *rec = dst + (b * groups + g) * Q8_GROUP_BYTES;
            for (long j = 0; j < n && !bad; j++)
                bad = q8_0_record(w + (b * BLK + j) * row + g * Q8_0_BYTES, (float *)rec + j,
                                  (signed char *)rec + BLK * sizeof(float) + j);
        }
        if (bad) {
#pragma omp atomic write
            refused = 1;
        }
    }
    return refused;
}
