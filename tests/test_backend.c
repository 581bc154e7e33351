/* The stage on a resident backend, without a GPU: the shadow backend
 * (kn_shadow.h) keeps its buffers behind pointers the host cannot
 * dereference and runs the CPU ops, so training through it must give the
 * CPU's results bit for bit, and any place where the stage, the trainer or
 * the checkpoint code reads or writes a backend buffer directly (instead of
 * upload/download/pull/push) crashes the test. This is the CUDA path's
 * host/device bookkeeping, checked on every machine. */
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "be_testutil.h"
#include "kn_shadow.h"

static const be_tol exact = {0, 0, 0, 0};

/* The premise: a shadow pointer really cannot be used on the host. */
static void test_shadow_faults(void)
{
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        if (fd >= 0)
            dup2(fd, 2); /* the sanitizers' report of the fault is expected */
        float *p = kn_shadow_be.alloc(64, NULL);
        volatile float *v = p;
        v[3] = 1.0f;
        _exit(0);
    }
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECKF(!(WIFEXITED(st) && WEXITSTATUS(st) == 0),
           "writing through a shadow pointer did not fault");
    printf("    host write through a shadow pointer: %s\n",
           WIFSIGNALED(st) ? strsignal(WTERMSIG(st)) : "aborted by the sanitizer");
    /* and an op given a host pointer is named */
    float host[4] = {0};
    kn_shadow_be.scale(host, 4, 2.0f);
    CHECK(kn_shadow_violation() != NULL && strstr(kn_shadow_violation(), "sh_scale"));
    kn_shadow_reset();
}

static void test_training(void)
{
    be_check_training(&kn_shadow_be, &exact);
    be_check_training_bf16(&kn_shadow_be, &exact);
    CHECKF(!kn_shadow_violation(), "%s", kn_shadow_violation());
}

static void test_classify(void)
{
    be_check_classify(&kn_shadow_be, &exact, 0);
    sl_err err = {0};
    if (kn_be_cpu()->bf16_check(&err) == 0)
        be_check_classify(&kn_shadow_be, &exact, DEV_STAGE_BF16_COMPUTE);
    CHECKF(!kn_shadow_violation(), "%s", kn_shadow_violation());
}

static void test_slots(void)
{
    be_check_slots(&kn_shadow_be, &exact, 0);
    sl_err err = {0};
    if (kn_be_cpu()->bf16_check(&err) == 0)
        be_check_slots(&kn_shadow_be, &exact, DEV_STAGE_BF16_COMPUTE);
    CHECKF(!kn_shadow_violation(), "%s", kn_shadow_violation());
}

static char tmpdir[] = "/tmp/skyloom-backend-XXXXXX";

/* Everything a trainer does with the backend: create (3 stages, 2
 * micro-batches), two steps, an evaluation, a checkpoint saved and loaded
 * into a second trainer; then a classifier of 2 stages (the head alone on
 * the second): a step and an evaluation. Returns -1 at the first error,
 * with err set. */
static unsigned scenario_flags; /* dev_stage_create flags of the scenario */
static int scenario(sl_err *err)
{
    static const int three[] = {0, 2, 4, 5};
    dev_optim o;
    dev_optim_default(&o);
    int rc = -1;
    dev_train *t = dev_train_create_on(&be_cfg, three, 3, BE_B, BE_T, 2, 7, &kn_shadow_be,
                                       scenario_flags, err);
    dev_train *u = NULL, *c = NULL;
    dt_batch b;
    dt_make_batch(&b, BE_B, BE_T, be_cfg.vocab, 555);
    dev_batch db = dt_view(&b);
    dev_step_info info;
    double loss;
    int masked;
    char dir[600];
    snprintf(dir, sizeof dir, "%s/faults", tmpdir);
    if (!t || dev_train_step(t, &db, &o, &info, err) || dev_train_step(t, &db, &o, &info, err) ||
        dev_train_eval(t, &db, &loss, &masked, err) ||
        dev_ckpt_save((dev_stage *[]){dev_train_stage(t, 0)}, 1, DEV_OPT_ADAMW, dir, NULL, 0, err))
        goto out;
    u = dev_train_create_on(&be_cfg, three, 3, BE_B, BE_T, 2, 7, &kn_shadow_be, scenario_flags,
                            err);
    if (!u || dev_ckpt_load(dev_train_stage(u, 0), DEV_OPT_ADAMW, dir, err))
        goto out;
    static const int head[] = {0, 4, 5};
    dev_config cc = be_cfg;
    cc.task = DEV_TASK_CLASSIFY;
    cc.num_labels = 3;
    cc.cls_dropout = 0.1f;
    dt_classify(&b, 3, 556);
    if (!(c = dev_train_create_on(&cc, head, 2, BE_B, BE_T, 2, 7, &kn_shadow_be, scenario_flags,
                                  err)) ||
        dev_train_step(c, &db, &o, &info, err) || dev_train_eval(c, &db, &loss, &masked, err))
        goto out;
    rc = 0;
out:
    dt_free_batch(&b);
    dev_train_free(t);
    dev_train_free(u);
    dev_train_free(c);
    return rc;
}

/* SQLite-style: make each buffer operation of the scenario fail in turn.
 * Every failure must come back as an error naming it (none swallowed), with
 * no crash and, under ASan, no leak. In fp32, and in bf16 compute where the
 * CPU has it (its bf16 weights and scratch are buffers too). */
static void faults(unsigned flags)
{
    sl_err err = {0};
    scenario_flags = flags;
    kn_shadow_ops = 0;
    kn_shadow_fail_at = 0;
    CHECKF(scenario(&err) == 0, "%s", err.msg);
    long total = kn_shadow_ops, stride = total / 600 + 1, tried = 0, bad = 0;
    for (long k = 1; k <= total; k += stride) {
        sl_err e = {0};
        kn_shadow_ops = 0;
        kn_shadow_fail_at = k;
        int rc = scenario(&e);
        tried++;
        /* an allocation failure is reported by the stage as what it could
         * not allocate; every other one in the backend's words */
        int named = strstr(e.msg, "injected failure") ||
                    (e.code == SL_ENOMEM && strstr(e.msg, "cannot allocate"));
        if (rc != -1 || !named) {
            if (bad++ < 5)
                fprintf(stderr, "operation %ld of %ld failed but the scenario %s (%s)\n", k, total,
                        rc ? "reported another error" : "succeeded", e.msg);
        }
    }
    kn_shadow_fail_at = 0;
    printf("    %s%ld of %ld buffer operations failed in turn: %ld not reported\n",
           flags ? "bf16: " : "", tried, total, bad);
    CHECK(tried > 50 && bad == 0);
    CHECK(scenario(&err) == 0); /* and nothing is left broken */
    scenario_flags = 0;
}

static void test_faults(void)
{
    faults(0);
    sl_err err = {0};
    if (kn_be_cpu()->bf16_check(&err) == 0)
        faults(DEV_STAGE_BF16_COMPUTE);
}

static void test_ckpt(void)
{
    be_check_ckpt(&kn_shadow_be, &exact, tmpdir);
    CHECKF(!kn_shadow_violation(), "%s", kn_shadow_violation());
}

static void cases(void)
{
    RUN(test_shadow_faults);
    RUN(test_training);
    RUN(test_slots);
    RUN(test_classify);
    RUN(test_ckpt);
    RUN(test_faults);
}

int main(void)
{
    if (dt_in_tmpdir(tmpdir, cases))
        return 1;
    return sl_test_done();
}
