/* A float32 matmul over a few rows that streams the weight once: y (rows, out) = x (rows, in) @ W.t().
 *
 * Why (yue/model/rowkernel.py has the measurements): on a CPU a verifying step's 2-9 rows should cost
 * about what one row does, since the weights' bytes, not the arithmetic, bound a decode step. MKL's
 * small-M GEMM re-packs the weight on every call and oneDNN's pre-packed GEMM streams it slower than
 * MKL's one-row GEMV, so each extra row cost ~0.5 of a step; this loop reads every weight once for all
 * rows, keeping their sums in registers, and for one row streams faster than MKL's GEMV.
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

#define BLK 32       /* outputs per column block: two AVX512 vectors, four AVX2 ones */
#define MAX_R 9      /* rows per pass: a verifying step's k + 1 with k = 8 drafts */
#define PREFETCH 256 /* floats ahead (8 inputs of a block) that each stream is prefetched */

/* NB adjacent column blocks from block b for R rows: the R x NB x BLK sums stay in registers for the
 * whole input loop, and the NB blocks are NB concurrent memory streams. One stream leaves the memory
 * system idle: one row over SmolLM2's layers and head (one thread, Xeon) 79 ms with one stream, 71 with
 * two, 58 with four, against MKL's GEMV 66; 4 rows 66 ms with two streams, 54 with three. More rows
 * need more sums, so fewer streams (R x NB x 2 vectors within ~24 of AVX512's 32 registers). */
#define BLOCKS_FN(NAME, R, NB)                                                                              \
    static void NAME(const float *x, long in, const float *w, float *y, long out, long b) {                 \
        float acc[R][NB][BLK];                                                                              \
        for (int r = 0; r < R; r++)                                                                         \
            for (int k = 0; k < NB; k++)                                                                    \
                for (int j = 0; j < BLK; j++) acc[r][k][j] = 0.f;                                           \
        for (long i = 0; i < in; i++) {                                                                     \
            for (int k = 0; k < NB; k++) {                                                                  \
                const float *wi = w + k * in * BLK + i * BLK;                                               \
                __builtin_prefetch(wi + PREFETCH, 0, 0);                                                    \
                __builtin_prefetch(wi + PREFETCH + 16, 0, 0);                                               \
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
 * over when a matmul's count is not a multiple of NB. */
static const int STREAMS[MAX_R + 1] = {0, 4, 4, 3, 3, 2, 2, 1, 1, 1};
BLOCKS_FN(block_1, 1, 4)
BLOCKS_FN(block_2, 2, 4)
BLOCKS_FN(block_3, 3, 3)
BLOCKS_FN(block_4, 4, 3)
BLOCKS_FN(block_5, 5, 2)
BLOCKS_FN(block_6, 6, 2)
BLOCKS_FN(block_7, 7, 1)
BLOCKS_FN(block_8, 8, 1)
BLOCKS_FN(block_9, 9, 1)
BLOCKS_FN(single_1, 1, 1)
BLOCKS_FN(single_2, 2, 1)
BLOCKS_FN(single_3, 3, 1)
BLOCKS_FN(single_4, 4, 1)
BLOCKS_FN(single_5, 5, 1)
BLOCKS_FN(single_6, 6, 1)

typedef void (*block_fn)(const float *, long, const float *, float *, long, long);
static const block_fn BLOCKS[MAX_R + 1] = {0, block_1, block_2, block_3, block_4,
                                           block_5, block_6, block_7, block_8, block_9};
static const block_fn SINGLES[MAX_R + 1] = {0, single_1, single_2, single_3, single_4,
                                            single_5, single_6, block_7, block_8, block_9};

/* x: (rows, in) row-major; w: rowkernel.block's layout; y: (rows, out) row-major. Rows beyond MAX_R
 * take further passes; groups of column blocks are shared among `threads` OpenMP threads where built
 * with it. */
void rows_matmul(const float *x, long rows, long in, const float *w, float *y, long out, int threads) {
    const long blocks = (out + BLK - 1) / BLK;
    for (long r0 = 0; r0 < rows; r0 += MAX_R) {
        const long R = rows - r0 < MAX_R ? rows - r0 : MAX_R;
        const long nb = STREAMS[R], groups = blocks / nb;
        const float *xr = x + r0 * in;
        float *yr = y + r0 * out;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
        for (long g = 0; g < groups; g++) BLOCKS[R](xr, in, w + g * nb * in * BLK, yr, out, g * nb);
        for (long b = groups * nb; b < blocks; b++) SINGLES[R](xr, in, w + b * in * BLK, yr, out, b);
    }
}

int rows_block(void) { return BLK; }
