/* Training on the GPU (the CUDA backend) against the CPU: the same steps,
 * splits, optimizers, checkpoints, in-flight slots and classification head
 * as test_backend.c,
 * within tolerances (cuBLAS sums in another order than OpenBLAS). Skips with
 * the probe's reason when this build has no CUDA or the machine no GPU. */
#include "be_testutil.h"
#include "kn_backend.h"

/* fp32 on both sides; measured differences are reported, the bounds leave
 * room for cuBLAS's summation order growing through three steps of Adam. */
static const be_tol gpu_tol = {.loss = 1e-5, .params = 1e-5, .grads = 1e-3, .moments = 1e-3};
/* bf16 compute on both sides: a product computed in another order rounds
 * to bf16 on the other side of a tie now and then, which moves its
 * activation by an ulp (2^-8); set without a GPU run, from the CPU's
 * 4-versus-1 micro-batch comparison (test_stages) and the ops' bars. */
static const be_tol gpu_tol16 = {.loss = 1e-3, .params = 1e-4, .grads = 2e-2, .moments = 2e-2};
static const kn_be *gpu;
static char tmpdir[] = "/tmp/skyloom-devcuda-XXXXXX";

static void test_training(void) { be_check_training(gpu, &gpu_tol); }
static void test_slots(void) { be_check_slots(gpu, &gpu_tol, 0); }
/* bf16 compute needs a GPU of compute capability 8.0 or newer */
static void test_training_bf16(void)
{
    sl_err err = {0};
    if (gpu->bf16_check(&err)) {
        printf("    bf16 not compared on this GPU: %s\n", err.msg);
        return;
    }
    be_check_training_bf16(gpu, &gpu_tol16);
    be_check_slots(gpu, &gpu_tol16, DEV_STAGE_BF16_COMPUTE);
    be_check_classify(gpu, &gpu_tol16, DEV_STAGE_BF16_COMPUTE);
}
static void test_ckpt(void) { be_check_ckpt(gpu, &gpu_tol, tmpdir); }
static void test_classify(void) { be_check_classify(gpu, &gpu_tol, 0); }

static void cases(void)
{
    RUN(test_training);
    RUN(test_slots);
    RUN(test_ckpt);
    RUN(test_classify);
    RUN(test_training_bf16);
}

int main(void)
{
    sl_err err = {0};
    char why[512];
    gpu = kn_be_open("auto", why, sizeof why, &err);
    if (!gpu || !gpu->resident) {
        snprintf(why, sizeof why, "no GPU: %s", kn_cuda_probe()->reason);
        sl_test_skip(why);
    }
    printf("backend: %s\n", why);
    if (dt_in_tmpdir(tmpdir, cases))
        return 1;
    return sl_test_done();
}
