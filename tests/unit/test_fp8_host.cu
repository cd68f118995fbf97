/*
 * test_fp8_host: the reference's FP8 conversion (ref_fp8.c, plain C) against CUDA's own
 * (__nv_cvt_float_to_fp8 with __NV_SATFINITE, its host code: no GPU needed), on every 257th
 * float bit pattern (16.7 million, every exponent and sign, the infinities and NaNs among them)
 * in both formats. Built where the CUDA toolkit is; the GPU's kernels are then checked against
 * the reference in test_gpu_kernels.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include <cmocka.h>

#include "exec_ref.h"
}

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

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_conversion)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
