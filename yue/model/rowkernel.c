/* A float32 matmul over a few rows that streams the weight once: y (rows, out) = x (rows, in) @ W.t().
 *
 * Why (yue/model/rowkernel.py has the measurements): on a CPU a verifying step's 2-9 rows should cost
 * about what one row does, since the weights' bytes, not the arithmetic, bound a decode step. MKL's
 * small-M GEMM re-packs the weight on every call and oneDNN's pre-packed GEMM streams it slower than
 * MKL's one-row GEMV, so each extra row cost ~0.5 of a step; this loop reads every weight once for all
 * rows, keeping their sums in registers.
 *
 * Layout (rowkernel.block): W (out, in) as column blocks of BLK outputs, (ceil(out / BLK), in, BLK),
 * zero-padded; each block is one contiguous stream, read input by input.
 *
 * Exactness: y[r][o] is one fmaf chain over the inputs in order, whatever the row count, the row's
 * place in the call or the thread count (a block is one thread's), so a row's result is the same bits
 * in every call (the tests check it).
 */
#include <math.h>
#include <stddef.h>

#define BLK 32       /* outputs per column block: two AVX512 vectors, four AVX2 ones */
#define MAX_R 9      /* rows per pass: a verifying step's k + 1 with k = 8 drafts */
#define PREFETCH 512 /* floats ahead (16 inputs of a block) that the stream is prefetched */

/* One column block b for R rows: the R x BLK sums stay in registers for the whole input loop. */
#define BLOCK_FN(R)                                                                            \
    static void block_##R(const float *x, long in, const float *w, float *y, long out, long b) { \
        float acc[R][BLK];                                                                      \
        for (int r = 0; r < R; r++)                                                             \
            for (int j = 0; j < BLK; j++) acc[r][j] = 0.f;                                      \
        for (long i = 0; i < in; i++) {                                                         \
            const float *wi = w + i * BLK;                                                      \
            for (int q = 0; q < BLK; q += 16) __builtin_prefetch(wi + PREFETCH + q, 0, 0);      \
            for (int r = 0; r < R; r++) {                                                       \
                const float xr = x[r * in + i];                                                 \
                for (int j = 0; j < BLK; j++) acc[r][j] = fmaf(xr, wi[j], acc[r][j]);           \
            }                                                                                   \
        }                                                                                       \
        long n = out - b * BLK < BLK ? out - b * BLK : BLK; /* the last block may be partial */ \
        for (int r = 0; r < R; r++)                                                             \
            for (long j = 0; j < n; j++) y[r * out + b * BLK + j] = acc[r][j];                  \
    }

BLOCK_FN(1)
BLOCK_FN(2)
BLOCK_FN(3)
BLOCK_FN(4)
BLOCK_FN(5)
BLOCK_FN(6)
BLOCK_FN(7)
BLOCK_FN(8)
BLOCK_FN(9)

typedef void (*block_fn)(const float *, long, const float *, float *, long, long);
static const block_fn BLOCKS[MAX_R + 1] = {0, block_1, block_2, block_3, block_4,
                                           block_5, block_6, block_7, block_8, block_9};

/* x: (rows, in) row-major; w: rowkernel.block's layout; y: (rows, out) row-major. Rows beyond MAX_R
 * take further passes; column blocks are shared among `threads` OpenMP threads where built with it. */
void rows_matmul(const float *x, long rows, long in, const float *w, float *y, long out, int threads) {
    const long blocks = (out + BLK - 1) / BLK;
    for (long r0 = 0; r0 < rows; r0 += MAX_R) {
        const long R = rows - r0 < MAX_R ? rows - r0 : MAX_R;
        const block_fn fn = BLOCKS[R];
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
        for (long b = 0; b < blocks; b++) fn(x + r0 * in, in, w + b * in * BLK, y + r0 * out, out, b);
    }
}

int rows_block(void) { return BLK; }
