#include "kn_backend.h"

#include <cblas.h>

const char *kn_blas_name(void) { return openblas_get_config(); }
int kn_blas_threads(void) { return openblas_get_num_threads(); }
void kn_blas_set_threads(int n) { openblas_set_num_threads(n); }
