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
    CHECKF(!kn_shadow_violation(), "%s", kn_shadow_violation());
}

static void test_slots(void)
{
    be_check_slots(&kn_shadow_be, &exact);
    CHECKF(!kn_shadow_violation(), "%s", kn_shadow_violation());
}

static char tmpdir[] = "/tmp/skyloom-backend-XXXXXX";

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
    RUN(test_ckpt);
}

int main(void)
{
    if (dt_in_tmpdir(tmpdir, cases))
        return 1;
    return sl_test_done();
}
