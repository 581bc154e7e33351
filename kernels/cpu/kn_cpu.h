/* kn_cpu.h - what the CPU ops' files share with each other (not an API). */
#ifndef KN_CPU_H
#define KN_CPU_H

/* Records the first failed bf16 product of this thread (`what` names the
 * op); the CPU backend's sync reports it (kn_cpu_status, kn_dnnl.c). */
void kn_cpu_fail(const char *what);
/* dst[c] += sum over rows n of x[n*ld + c], c in [0, C) (kn_cpu.c). */
void kn_colsum_add(float *dst, const float *x, int N, int ld, int C);

#endif
