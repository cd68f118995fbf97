/*
 * test_fp8_host: the reference's FP8 conversion (ref_fp8.c, plain C) against CUDA's own
 * (__nv_cvt_float_to_fp8 with __NV_SATFINITE, its host code: no GPU needed), on every 257th
 * float bit pattern (16.7 million, every exponent and sign, the infinities and NaNs among them)
 * in both formats. Built where the CUDA toolkit is; the GPU's kernels are then checked against
 * the reference in test_gpu_kernels. Also the fused fp8 kernels' map from a block to its expert's
 * tile (gk_expert_tile, host and device code alike) against the regions exec_fp8_regions lays out,
 * from a row to its expert (gk_expert_of), and the tile kernels' maps from a thread to its
 * values (each value once, each warp's shared-memory accesses in banks of their own).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include <cmocka.h>

#include "exec_ref.h"
}
#include "gpu_kernels.h"

#include <cuda_fp8.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static void test_conversion(void **state)
{
    (void)state;
    long diff = 0, tried = 0;
    for (uint64_t b = 0; b < (1ull << 32); b += 257)
        for (int f = 0; f < 2; f++) {
            uint32_t bits = (uint32_t)b;
            float x;
            memcpy(&x, &bits, sizeof x);
            unsigned char ours = exec_fp8_from_float(x, (enum exec_fp8)f);
            unsigned char cuda =
                (unsigned char)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, f ? __NV_E5M2 : __NV_E4M3);
            bool same = isnan(x) ? isnan(exec_fp8_to_float(cuda, (enum exec_fp8)f)) &&
                                       isnan(exec_fp8_to_float(ours, (enum exec_fp8)f))
                                 : ours == cuda;
            if (!same && diff++ < 5)
                printf("  %a (%s): ours 0x%02x, CUDA's 0x%02x\n", (double)x, f ? "e5m2" : "e4m3",
                       ours, cuda);
            tried++;
        }
    printf("fp8 conversion: %ld floats x formats, %ld differ from CUDA's\n", tried, diff);
    assert_int_equal(diff, 0);
}

/* Eight experts' row offsets: uneven splits, experts of no rows among them (all of them, or all
 * but the last), even ones */
static const int splits[][9] = {{0, 0, 1, 17, 40, 41, 99, 99, 100},
                                {0, 300, 300, 300, 301, 560, 1000, 1000, 1024},
                                {0, 0, 0, 0, 0, 0, 0, 0, 0},
                                {0, 0, 0, 0, 0, 0, 0, 0, 7},
                                {0, 128, 256, 384, 512, 640, 768, 896, 1024}};

/* Every block of a launch of gk_expert_tiles(...) blocks maps to one tile of one expert, each
 * expert's tiles once in order (its rows, or rows padded to 16, by 128; its columns by 128),
 * with the expert's region as exec_fp8_regions gives it; a block past them maps to none. The
 * splits above, widths of 1 to 3 column tiles. */
static void test_expert_tiles(void **state)
{
    (void)state;
    static const int widths[] = {32, 256, 272, 384};
    int checked = 0;
    for (auto &off : splits)
        for (int cols : widths)
            for (int padded = 0; padded < 2; padded++) {
                const int E = 8;
                size_t q[E + 1], s[E + 1], st[E + 1];
                exec_fp8_regions(off, E, cols, q, s, st);
                size_t n = gk_expert_tiles(off, E, cols, padded), b = 0;
                for (int e = 0; e < E; e++) {
                    int rows = off[e + 1] - off[e], span = padded ? exec_fp8_pad(rows) : rows;
                    for (int r0 = 0; r0 < span; r0 += GK_FP8_TILE)
                        for (int c0 = 0; c0 < cols; c0 += GK_FP8_TILE, b++) {
                            int ge, gr, gc;
                            size_t gq, gs, gst;
                            gk_expert_tile(off, E, cols, padded, b, &ge, &gr, &gc, &gq, &gs, &gst);
                            if (ge != e || gr != r0 || gc != c0 || gq != q[e] || gs != s[e] ||
                                gst != st[e])
                                fail_msg("block %zu (cols %d, padded %d): expert %d tile (%d, %d) "
                                         "region %zu %zu %zu; expected %d (%d, %d) %zu %zu %zu",
                                         b, cols, padded, ge, gr, gc, gq, gs, gst, e, r0, c0, q[e],
                                         s[e], st[e]);
                            checked++;
                        }
                }
                assert_int_equal(b, n);
                int ge, gr, gc;
                size_t gq, gs, gst;
                gk_expert_tile(off, E, cols, padded, n, &ge, &gr, &gc, &gq, &gs, &gst);
                assert_int_equal(ge, -1);
            }
    printf("fused fp8 kernels' tiles: %d blocks, each its expert's tile and region\n", checked);
}

/* Which expert's rows a row of a permuted matrix is (gk_expert_of: per-tensor fp8's kept amax
 * goes to it), for every row of the splits above and of their first E experts: the expert e with
 * off[e] <= row < off[e + 1]; without offsets, the row itself. */
static void test_expert_of(void **state)
{
    (void)state;
    int checked = 0;
    for (auto &off : splits)
        for (int E = 1; E <= 8; E++)
            for (int r = 0; r < off[E]; r++, checked++) {
                int e = gk_expert_of(off, E, r);
                if (e < 0 || e >= E || off[e] > r || r >= off[e + 1])
                    fail_msg("row %d of %d experts (%d rows): expert %d", r, E, off[E], e);
            }
    for (int r = 0; r < 100; r++) assert_int_equal(gk_expert_of(NULL, 0, r), r);
    printf("rows to experts: %d rows, each its expert's\n", checked);
}

/* The fp8 tile kernels' maps from a step to the values it moves (gk_fp8_load_at, gk_fp8_row_at,
 * gk_fp8_col_at): every value of a 128 x 128 tile moved once; and each warp's shared-memory
 * accesses (a tile row GK_FP8_TPAD bf16 apart; 32 consecutive steps, one access of each lane at
 * a time) at most one address a bank: the input's 16-byte loads as four words, the runs along a
 * row and down a column value by value, and the tile scales' scan (a thread a row, or a thread
 * a column) value by value. */
static void test_tile_maps(void **state)
{
    (void)state;
    const int T = GK_FP8_TILE, P = GK_FP8_TPAD;
    static_assert(GK_FP8_THREADS % 32 == 0, "whole warps");
    struct map {
        const char *name;
        void (*at)(int, int *, int *);
        int steps, len, words; /* values a step, accesses a step */
        bool down;
    } maps[] = {{"16-byte loads", gk_fp8_load_at, T * T / 8, 8, 4, false},
                {"runs along a row", gk_fp8_row_at, T * T / 16, 16, 16, false},
                {"runs down a column", gk_fp8_col_at, T * T / 16, 16, 16, true}};
    int warps = 0;
    /* the warp's addresses (in 32-bit words) at one access: at most one address a bank */
    auto one_a_bank = [&](const char *what, const int *word, int w, int k) {
        for (int a = 0; a < 32; a++)
            for (int b = 0; b < a; b++)
                if (word[a] != word[b] && word[a] % 32 == word[b] % 32)
                    fail_msg("%s: warp %d, access %d: lanes %d and %d, words %d and %d, one bank",
                             what, w, k, b, a, word[b], word[a]);
    };
    for (const auto &m : maps) {
        static int seen[GK_FP8_TILE][GK_FP8_TILE];
        memset(seen, 0, sizeof seen);
        for (int i = 0; i < m.steps; i++) {
            int r, c;
            m.at(i, &r, &c);
            for (int k = 0; k < m.len; k++) {
                int rr = m.down ? r + k : r, cc = m.down ? c : c + k;
                assert_true(rr >= 0 && rr < T && cc >= 0 && cc < T);
                seen[rr][cc]++;
            }
        }
        for (int r = 0; r < T; r++)
            for (int c = 0; c < T; c++)
                if (seen[r][c] != 1)
                    fail_msg("%s: value (%d, %d) moved %d times", m.name, r, c, seen[r][c]);
        for (int w = 0; w < m.steps / 32; w++, warps++)
            for (int k = 0; k < m.words; k++) {
                int word[32];
                for (int l = 0; l < 32; l++) {
                    int r, c;
                    m.at(w * 32 + l, &r, &c);
                    word[l] = m.len == 8 ? (r * P + c) / 2 + k /* 8 values: four words */
                                         : ((m.down ? r + k : r) * P + (m.down ? c : c + k)) / 2;
                }
                one_a_bank(m.name, word, w, k);
            }
    }
    for (int col = 0; col < 2; col++) /* the scales' scan: lanes 32 consecutive lines */
        for (int w = 0; w < T / 32; w++, warps++)
            for (int k = 0; k < T; k++) {
                int word[32];
                for (int l = 0; l < 32; l++) {
                    int line = w * 32 + l;
                    word[l] = (col ? k * P + line : line * P + k) / 2;
                }
                one_a_bank(col ? "the columns' scan" : "the rows' scan", word, w, k);
            }
    printf("fp8 tile maps: every value moved once; %d warps' shared-memory accesses one address "
           "a bank\n",
           warps);
}

/* The per-tensor kernels' tile of fp8 bytes (gk_fp8_t8_at, gk_fp8_patch_at): every word of the
 * tile at a word of its own; one address a bank at each access of a warp: a row's 32 words stored
 * by a warp (SwiGLU's backward), two rows' word pairs by a warp's 64-bit stores, a half-warp a row
 * (the cast; a 64-bit access serves half a warp at a time), and the transpose's reads, a lane a
 * patch of 16 rows of one word column (its patches: every word once). */
static void test_byte_tile(void **state)
{
    (void)state;
    const int T = GK_FP8_TILE, W = T / 4;
    static int seen[GK_FP8_TILE * GK_FP8_TILE / 4];
    memset(seen, 0, sizeof seen);
    for (int r = 0; r < T; r++)
        for (int cw = 0; cw < W; cw++) {
            int a = gk_fp8_t8_at(r, cw);
            assert_true(a >= 0 && a < T * W);
            if (seen[a]++) fail_msg("byte tile: (%d, %d) at word %d, taken", r, cw, a);
        }
    auto one_a_bank = [](const char *what, const int *word, int n, int at) {
        for (int a = 0; a < n; a++)
            for (int b = 0; b < a; b++)
                if (word[a] % 32 == word[b] % 32)
                    fail_msg("byte tile, %s (%d): words %d and %d, one bank", what, at, word[b],
                             word[a]);
    };
    int word[32], accesses = 0;
    for (int r = 0; r < T; r++, accesses++) { /* a warp a row */
        for (int l = 0; l < 32; l++) word[l] = gk_fp8_t8_at(r, l);
        one_a_bank("a row's stores", word, 32, r);
    }
    for (int r = 0; r < T; r++, accesses++) { /* a half-warp a row, 64 bits a lane */
        for (int l = 0; l < 16; l++) {
            word[2 * l] = gk_fp8_t8_at(r, 2 * l);
            word[2 * l + 1] = gk_fp8_t8_at(r, 2 * l + 1);
            assert_int_equal(word[2 * l] % 2, 0);
            assert_int_equal(word[2 * l + 1], word[2 * l] + 1); /* one aligned 64-bit word */
        }
        one_a_bank("a half-warp's 64-bit stores", word, 32, r);
    }
    memset(seen, 0, sizeof seen);
    for (int w = 0; w < GK_FP8_THREADS / 32; w++)
        for (int i = 0; i < 16; i++, accesses++) {
            for (int l = 0; l < 32; l++) {
                int rg, cg;
                gk_fp8_patch_at(w * 32 + l, &rg, &cg);
                assert_true(rg >= 0 && rg < T / 16 && cg >= 0 && cg < W);
                word[l] = gk_fp8_t8_at(16 * rg + i, cg);
                seen[word[l]]++;
            }
            one_a_bank("the transpose's reads", word, 32, w * 16 + i);
        }
    for (int a = 0; a < T * W; a++)
        if (seen[a] != 1) fail_msg("byte tile: word %d read %d times by the transpose", a, seen[a]);
    printf("fp8 byte tile: every word once, %d warp accesses one address a bank\n", accesses);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conversion), cmocka_unit_test(test_expert_tiles),
        cmocka_unit_test(test_expert_of), cmocka_unit_test(test_tile_maps),
        cmocka_unit_test(test_byte_tile)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
