/* This core's arithmetic peaks, the limits a verifying row's cost is judged against (a development
 * program, not part of the package): the clock (4 dependent integer adds an iteration), float32 FMAs
 * (512- and 256-bit) and int8 dot products (VNNI's dpbusd, 512- and 256-bit), each over 10 independent
 * chains so that latency does not bound them. The thread's CPU time, so that other processes on a shared
 * machine do not count.
 *
 *     gcc -O2 -march=native docs/recipes/cpu_peaks.c -o /tmp/cpu_peaks && /tmp/cpu_peaks
 */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#define N 100000000L
#define REP10(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Runs OP over 10 chains a0..a9 of type T seeded distinctly (no common subexpressions), N / 10 times. */
#define BENCH(NAME, T, SEED, OP, PER_OP, SUM)                                                              \
    {                                                                                                       \
        T a0 = SEED(1), a1 = SEED(2), a2 = SEED(3), a3 = SEED(4), a4 = SEED(5), a5 = SEED(6), a6 = SEED(7), \
          a7 = SEED(8), a8 = SEED(9), a9 = SEED(10);                                                        \
        double t = now();                                                                                   \
        for (long n = 0; n < N / 10; n++) { REP10(OP) }                                                     \
        t = now() - t;                                                                                      \
        printf("%-12s %7.1f G/s = %5.1f a cycle (check %g)\n", NAME, N * (double)PER_OP / t / 1e9,          \
               N * (double)PER_OP / t / ghz / 1e9, (double)(SUM));                                        \
    }

int main(void) {
    long x = 0;
    double t = now();
    for (long i = 0; i < N * 10; i++) __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
    const double ghz = 4.0 * N * 10 / (now() - t) / 1e9;
    printf("clock        %7.2f GHz (%ld)\n", ghz, x);
    const __m512 b = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-9f);
    const __m256 b8 = _mm256_set1_ps(1.0000001f), c8 = _mm256_set1_ps(1e-9f);
    const __m512i u = _mm512_set1_epi8(3), v = _mm512_set1_epi8(5);
    const __m256i u8 = _mm256_set1_epi8(3), v8 = _mm256_set1_epi8(5);
#define S512(k) _mm512_set1_ps(k)
#define S256(k) _mm256_set1_ps(k)
#define I512(k) _mm512_set1_epi32(k)
#define I256(k) _mm256_set1_epi32(k)
#define FMA512(i) a##i = _mm512_fmadd_ps(a##i, b, c);
#define FMA256(i) a##i = _mm256_fmadd_ps(a##i, b8, c8);
#define DOT512(i) a##i = _mm512_dpbusd_epi32(a##i, u, v);
#define DOT256(i) a##i = _mm256_dpbusd_epi32(a##i, u8, v8);
#define ALL(i) +a##i[0] /* every chain's result used: none is dead code */
    BENCH("fma zmm", __m512, S512, FMA512, 16, 0 REP10(ALL))
    BENCH("fma ymm", __m256, S256, FMA256, 8, 0 REP10(ALL))
    BENCH("dpbusd zmm", __m512i, I512, DOT512, 64, 0 REP10(ALL))
    BENCH("dpbusd ymm", __m256i, I256, DOT256, 32, 0 REP10(ALL))
    return 0;
}
