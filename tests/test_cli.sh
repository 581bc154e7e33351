#!/usr/bin/env bash
# The skyloom command: help, --version, errors for unknown commands/options.
set -u
sk="$1"
fail=0
check() { # check DESC CMD... : CMD must succeed
    local desc="$1"; shift
    if "$@"; then echo "ok   $desc"; else echo "FAIL $desc"; fail=1; fi
}
out=$("$sk" --version) ; rc=$?
check "--version exits 0" test $rc -eq 0
check "--version names the version" grep -q '^skyloom [0-9]' <<<"$out"
check "--version names the BLAS" grep -q 'cpu blas:.*OpenBLAS.*threads' <<<"$out"
check "--version says whether bf16 runs here (oneDNN, its instructions)" grep -Eq 'cpu bf16:  oneDNN [0-9.]+, [A-Z0-9_]+: (--precision bf16 available|bf16 needs)' <<<"$out"
check "--version tells whether CUDA is compiled in" grep -Eq 'cuda: +(compiled in|not compiled in)' <<<"$out"
check "--version names gRPC, OpenSSL, libsodium" bash -c 'grep -q "grpc core: [0-9]" <<<"$1" && grep -q "openssl:   OpenSSL" <<<"$1" && grep -q "libsodium: [0-9]" <<<"$1"' _ "$out"
if grep -q 'compiled in$' <<<"$(grep 'cuda:' <<<"$out")" && ! grep -q 'not compiled' <<<"$out"; then
    check "--version tells why there is no GPU, or names it" grep -Eq 'CUDA driver missing|cudaGetDeviceCount returned|gpu: +[^n]' <<<"$out"
fi
"$sk" help >/dev/null; check "help exits 0" test $? -eq 0
# The CUDA module (libskyloom_cuda.so) is opened only where the NVIDIA driver
# is; SKYLOOM_CUDA_FORCE_LOAD=1 opens it anyway, so its loading and its probe
# run here even without a GPU.
if grep -q 'cuda: *compiled in' <<<"$out"; then
  if grep -q 'libcuda.so.1 not loadable' <<<"$out"; then
    f=$(SKYLOOM_CUDA_FORCE_LOAD=1 "$sk" --version)
    check "the CUDA module loads and probes (forced, no driver)" grep -q 'cudaGetDeviceCount returned' <<<"$f"
  fi
  f=$(SKYLOOM_CUDA_FORCE_LOAD=1 SKYLOOM_CUDA_MODULE=/nonexistent/libskyloom_cuda.so "$sk" --version)
  check "a missing CUDA module is named, not fatal" grep -q 'CUDA module not loadable: /nonexistent/libskyloom_cuda.so' <<<"$f"
fi
"$sk" help version | grep -q 'usage: skyloom version'; check "help <command>" test $? -eq 0
err=$("$sk" frobnicate 2>&1); rc=$?
check "unknown command exits 2" test $rc -eq 2
check "unknown command is named" grep -q "unknown command 'frobnicate'" <<<"$err"
err=$("$sk" version --bogus 2>&1); rc=$?
check "unknown option exits 2 with a one-line reason" bash -c 'test $0 -eq 2 && grep -q "skyloom version: unknown option" <<<"$1"' "$rc" "$err"
"$sk" profile --json | grep -q '"cores"'; check "profile --json" test $? -eq 0
pool=$("$sk" profile --json | python3 -c 'import json,sys; p=json.load(sys.stdin)["cpu_pool"]; print(p["pool_cpus"], p["cpus"], p["quota_known"])')
check "profile: the cpu pool has the online CPUs, this process may use some of them" bash -c 'set -- $0; [ "${1%.0}" = "$(getconf _NPROCESSORS_ONLN)" ] && awk -v c="$2" -v p="$1" "BEGIN{exit !(c > 0 && c <= p)}" && [ "$3" = True ]' "$pool"
one=$(taskset -c 0 "$sk" profile 2>&1 | grep '^cpus:')
check "profile: an affinity of one CPU shows as one core" grep -q "may use 1 of" <<<"$one"
exit $fail
