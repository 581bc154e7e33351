/* The counter-based generator: same (seed, stream, index) -> same value,
 * however the range is split; different seeds and streams differ; the
 * uniforms are uniform enough. */
#include <stdint.h>
#include <string.h>

#include "sl_rng.h"
#include "sl_test.h"

#define N 10007

static void test_known_answer(void)
{
    /* Philox4x32-10 known-answer vectors from the Random123 distribution
     * (kat_vectors): counter 0, key 0 and counter/key all ones. */
    sl_u32x4 c = {{0, 0, 0, 0}};
    sl_u32x4 r = sl_philox4x32(c, 0, 0);
    CHECK(r.v[0] == 0x6627e8d5u && r.v[1] == 0xe169c58du && r.v[2] == 0xbc57ac4cu &&
          r.v[3] == 0x9b00dbd8u);
    sl_u32x4 c1 = {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}};
    r = sl_philox4x32(c1, 0xffffffffu, 0xffffffffu);
    CHECK(r.v[0] == 0x408f276du && r.v[1] == 0x41c83b0eu && r.v[2] == 0xa20bc7c6u &&
          r.v[3] == 0x6d5451fdu);
}

static void test_split_invariance(void)
{
    static uint32_t whole[N], parts[N];
    sl_rng_fill_u32(42, 7, 0, N, whole);
    for (size_t i = 0; i < N; i++)
        CHECK(whole[i] == sl_rng_u32(42, 7, i) || (printf("at %zu\n", i), 0));
    /* Split into uneven pieces starting at arbitrary offsets. */
    const size_t cuts[] = {0, 1, 3, 4, 5, 17, 1000, 1001, 5003, 9999, N};
    for (size_t k = 0; k + 1 < sizeof cuts / sizeof cuts[0]; k++)
        sl_rng_fill_u32(42, 7, cuts[k], cuts[k + 1] - cuts[k], parts + cuts[k]);
    CHECK(memcmp(whole, parts, sizeof whole) == 0);
    static float fw[N], fp[N];
    sl_rng_fill_uniform(42, 7, 0, N, fw);
    sl_rng_fill_uniform(42, 7, 0, 333, fp);
    sl_rng_fill_uniform(42, 7, 333, N - 333, fp + 333);
    CHECK(memcmp(fw, fp, sizeof fw) == 0);
    CHECK(fw[100] == sl_rng_uniform(42, 7, 100));
}

static void test_streams_differ(void)
{
    int same_seed = 0, same_stream = 0;
    for (uint64_t i = 0; i < 1000; i++) {
        same_seed += sl_rng_u32(1, 0, i) == sl_rng_u32(2, 0, i);
        same_stream += sl_rng_u32(1, 0, i) == sl_rng_u32(1, 1, i);
    }
    CHECK(same_seed < 3);
    CHECK(same_stream < 3);
    CHECK(sl_rng_stream(1, 2) != sl_rng_stream(2, 1));
    CHECK(sl_rng_stream(1, 2) == sl_rng_stream(1, 2));
}

static void test_uniform_moments(void)
{
    double sum = 0, sum2 = 0, nsum = 0, nsum2 = 0;
    int bins[10] = {0};
    const int n = 200000;
    for (int i = 0; i < n; i++) {
        float u = sl_rng_uniform(9, 3, (uint64_t)i);
        CHECK(u >= 0.0f && u < 1.0f);
        sum += u;
        sum2 += (double)u * u;
        bins[(int)(u * 10)]++;
        float z = sl_rng_normal(9, 4, (uint64_t)i);
        nsum += z;
        nsum2 += (double)z * z;
    }
    CHECK_NEAR(sum / n, 0.5, 0.005);
    CHECK_NEAR(sum2 / n - (sum / n) * (sum / n), 1.0 / 12, 0.002);
    for (int b = 0; b < 10; b++)
        CHECKF(bins[b] > n / 10 - 1000 && bins[b] < n / 10 + 1000, "bin %d has %d", b, bins[b]);
    CHECK_NEAR(nsum / n, 0.0, 0.01);
    CHECK_NEAR(nsum2 / n, 1.0, 0.02);
}

int main(void)
{
    RUN(test_known_answer);
    RUN(test_split_invariance);
    RUN(test_streams_differ);
    RUN(test_uniform_moments);
    return sl_test_done();
}
