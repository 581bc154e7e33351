#!/usr/bin/env bash
# OpenBLAS's cblas_sbgemm against oneDNN's bf16 matmul (bench_sbgemm.c), for
# docs/dependencies.md. Debian 12's OpenBLAS is built without bf16, so this
# builds Debian's own 0.3.21 source with BUILD_BFLOAT16=1 for this CPU's
# kernels (SAPPHIRERAPIDS with AMX, COOPERLAKE with AVX512_BF16) in a
# scratch directory, links bench_sbgemm.c statically against it and runs it
# on 1 and on 2 threads. Needs the source package: pass its unpacked
# directory, or have `apt-get source openblas` work (a deb-src line).
# usage: bench/sbgemm.sh [OPENBLAS_SOURCE_DIR] (env REPS, default 10)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=${1:-}
work=$(mktemp -d /tmp/skyloom-sbgemm-XXXXXX)
trap 'rm -rf "$work"' EXIT
if [ -z "$src" ]; then
  (cd "$work" && apt-get source --download-only openblas >/dev/null && tar xf openblas_*.orig.tar.xz)
  src=$(echo "$work"/OpenBLAS-*)
fi
if grep -qw amx_bf16 /proc/cpuinfo; then target=SAPPHIRERAPIDS
elif grep -qw avx512_bf16 /proc/cpuinfo; then target=COOPERLAKE
else echo "this CPU has neither AMX-BF16 nor AVX512_BF16: nothing to compare" >&2; exit 1; fi
lib=$(ls "$src"/libopenblas_*p-r*.a 2>/dev/null | head -1 || true)
if [ -z "$lib" ]; then
  make -C "$src" -j"$(nproc)" TARGET=$target BUILD_BFLOAT16=1 USE_OPENMP=1 NO_LAPACK=1 NOFORTRAN=1 \
      ONLY_CBLAS=1 DYNAMIC_ARCH=0 BUILD_SINGLE=1 BUILD_DOUBLE=0 BUILD_COMPLEX=0 BUILD_COMPLEX16=0 \
      libs >"$work/build.log" 2>&1
  lib=$(ls "$src"/libopenblas_*p-r*.a | head -1)
fi
gcc -O2 -fopenmp -I"$src" "$here/bench_sbgemm.c" "$lib" -ldnnl -lm -o "$work/bench_sbgemm"
for t in 1 2; do
  OMP_NUM_THREADS=$t "$work/bench_sbgemm" "${REPS:-10}"
  echo
done
