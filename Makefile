# Skyloom: a thin wrapper over meson. `make test` on a fresh Debian 12 machine
# installs what it needs (as root), builds and runs the whole suite.

BUILD      ?= build
ASAN_BUILD ?= build-asan
CUDA_BUILD ?= build-cuda
GPU_BUILD  ?= build-gpu
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
# The whole fuzz run's budget: each target gets FUZZ_SECONDS, or less when
# that would pass the budget (17 targets x 60 s would be 17 minutes; CI's
# whole run must stay under 30).
FUZZ_BUDGET ?= 480
MESON_OPTS ?=
PYTHON     ?= /usr/bin/python3
# make install: where (the build is configured for it), and a staging root
PREFIX     ?= /usr/local
DESTDIR    ?=
# CI builds warning-free or not at all.
ifeq ($(CI),true)
  MESON_OPTS += -Dwerror=true
endif
# meson finds nvcc only on PATH.
export PATH := $(PATH):/usr/local/cuda/bin

.PHONY: all deps build install test test-asan test-cuda test-gpu bench fuzz clean demo chaos testbed testbed-fed

all: build

deps:
	@scripts/deps.sh

$(BUILD)/build.ninja:
	meson setup $(BUILD) $(MESON_OPTS) --prefix=$(PREFIX)

build: deps $(BUILD)/build.ninja
	ninja -C $(BUILD)

# PREFIX/bin/skyloom, PREFIX/lib/libskyloom_cuda.so when CUDA is built,
# PREFIX/lib/systemd/system/skyloom-*.service (ExecStart at PREFIX/bin) and
# PREFIX/share/doc/skyloom, each below DESTDIR when it is set (a staged
# install, as GNU packages do). The build is configured for PREFIX first,
# since the binary looks for the CUDA module there. It builds what is not
# built yet but installs no Debian package (`make deps` or `make build` do).
install: $(BUILD)/build.ninja
	ninja -C $(BUILD)
	@cur=$$(meson introspect $(BUILD) --buildoptions | $(PYTHON) -c 'import json, sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "prefix"))'); \
	if [ "$$cur" != "$(PREFIX)" ]; then \
	  echo "meson configure $(BUILD) -Dprefix=$(PREFIX) (was $$cur)"; \
	  meson configure $(BUILD) -Dprefix=$(PREFIX) && ninja -C $(BUILD) || exit 1; \
	fi
	meson install -C $(BUILD) --no-rebuild $(if $(DESTDIR),--destdir "$(abspath $(DESTDIR))")

test: build
	@rm -f $(BUILD)/meson-logs/testlog.json
	@meson test -C $(BUILD) --print-errorlogs --num-processes 2 || true
	@$(PYTHON) scripts/test-summary.py $(BUILD)/meson-logs/testlog.json

# The same suite under AddressSanitizer and UndefinedBehaviorSanitizer. CUDA is
# left out here: the CUDA runtime and ASan's shadow memory do not mix; the
# CUDA build is checked on its own by `make test-cuda`. Optimized with debug
# info: the training tests run real steps, which at -O0 took most of CI's time.
$(ASAN_BUILD)/build.ninja:
	meson setup $(ASAN_BUILD) $(MESON_OPTS) -Db_sanitize=address,undefined -Db_lundef=false -Dcuda=disabled -Dbuildtype=debugoptimized

test-asan: deps $(ASAN_BUILD)/build.ninja
	ninja -C $(ASAN_BUILD)
	@rm -f $(ASAN_BUILD)/meson-logs/testlog.json
	@ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  meson test -C $(ASAN_BUILD) --print-errorlogs --num-processes 2 --timeout-multiplier 4 || true
	@$(PYTHON) scripts/test-summary.py $(ASAN_BUILD)/meson-logs/testlog.json

# A build with CUDA required: proves the .cu kernels compile and link, then
# runs the tests that load the CUDA module or ask for a GPU (suite `cuda`:
# each skips its GPU part with the probe's reason where no GPU answers).
# `make test` runs the whole suite, these included, on the default build,
# which has CUDA whenever nvcc is found.
$(CUDA_BUILD)/build.ninja:
	meson setup $(CUDA_BUILD) $(MESON_OPTS) -Dcuda=enabled

test-cuda: deps $(CUDA_BUILD)/build.ninja
	ninja -C $(CUDA_BUILD)
	@rm -f $(CUDA_BUILD)/meson-logs/testlog.json
	@meson test -C $(CUDA_BUILD) --suite cuda --print-errorlogs --num-processes 2 || true
	@$(PYTHON) scripts/test-summary.py $(CUDA_BUILD)/meson-logs/testlog.json

# On a machine with an NVIDIA GPU: a CUDA build for that GPU, the CUDA tests
# (every op and whole training runs against the CPU, fp32 and bf16),
# skyloom train on both, and a short GPU-against-CPU benchmark, in under
# eight minutes; the report goes to $(GPU_BUILD)/test-gpu.md ($$OUT when set).
test-gpu: deps
	@scripts/test-gpu.sh $(GPU_BUILD)

# libFuzzer targets (tests/fuzz/meson.build): clang, coverage instrumentation
# on all code, ASan+UBSan; each target runs min(FUZZ_SECONDS, FUZZ_BUDGET /
# number of targets) seconds on its own corpus in
# $(FUZZ_BUILD)/corpus/NAME (seeded from tests/fuzz/corpus/NAME and
# tests/fuzz/regress/NAME when present). A crash stops the run and leaves its
# input in $(FUZZ_BUILD)/crashes/: fix it and add the input to
# tests/fuzz/regress/NAME/, which `make test` replays.
$(FUZZ_BUILD)/build.ninja:
	CC=clang meson setup $(FUZZ_BUILD) $(MESON_OPTS) -Dfuzz=true -Dcuda=disabled \
	  -Db_sanitize=address,undefined -Db_lundef=false -Dc_args=-fsanitize=fuzzer-no-link

fuzz: deps $(FUZZ_BUILD)/build.ninja
	ninja -C $(FUZZ_BUILD) fuzz-targets
	@mkdir -p $(FUZZ_BUILD)/crashes
	@set -e; n=0; for exe in $(FUZZ_BUILD)/tests/fuzz/fuzz_*; do [ -f "$$exe" ] && [ -x "$$exe" ] && n=$$((n + 1)); done; \
	secs=$$(( $(FUZZ_BUDGET) / (n > 0 ? n : 1) )); [ $$secs -gt $(FUZZ_SECONDS) ] && secs=$(FUZZ_SECONDS); [ $$secs -ge 1 ] || secs=1; \
	echo "== $$n targets, $$secs s each (FUZZ_SECONDS=$(FUZZ_SECONDS), FUZZ_BUDGET=$(FUZZ_BUDGET))"; \
	for exe in $(FUZZ_BUILD)/tests/fuzz/fuzz_*; do \
	  [ -f "$$exe" ] && [ -x "$$exe" ] || continue; \
	  name=$${exe##*/fuzz_}; dirs=$(FUZZ_BUILD)/corpus/$$name; mkdir -p $$dirs; \
	  for d in tests/fuzz/corpus/$$name tests/fuzz/regress/$$name; do if [ -d $$d ]; then dirs="$$dirs $$d"; fi; done; \
	  echo "== fuzz_$$name for $$secs s (log: $(FUZZ_BUILD)/fuzz_$$name.log)"; \
	  if UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 $$exe -max_total_time=$$secs \
	      -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/crashes/$$name- $$dirs \
	      >$(FUZZ_BUILD)/fuzz_$$name.log 2>&1; then \
	    grep -E '^(Done|stat::(number_of_executed_units|new_units_added|peak_rss_mb))' $(FUZZ_BUILD)/fuzz_$$name.log; \
	  else \
	    tail -n 60 $(FUZZ_BUILD)/fuzz_$$name.log; \
	    echo "fuzz_$$name: crash; the input is in $(FUZZ_BUILD)/crashes/"; exit 1; \
	  fi; \
	done
# A small BERT trained on real text for about two minutes (scripts/demo.sh).
demo: build
	@scripts/demo.sh $(BUILD)

# Five minutes of the demo job while devices and the coordinator are killed
# and restarted; the report goes to $(BUILD)/chaos/report.md.
chaos: build
	@scripts/chaos.sh $(BUILD)

# The Sky Computing experiment on a WAN of network namespaces on this machine
# (scripts/testbed, as root): sites with shaped links, devices under CPU
# quotas, the same job planned by even, sky and optimal; docs/testbed.md.
testbed: build
	@scripts/testbed run $(BUILD)

# The federated experiment on the same WAN (docs/testbed.md, "Federation"):
# two data owners, replicas placed by the balancer under step/none, step/int8
# and outer:50/int8, and the equal share under step/none.
testbed-fed: build
	@scripts/testbed fed $(BUILD)

bench: build
	meson test -C $(BUILD) --benchmark --verbose --num-processes 1

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(CUDA_BUILD) $(GPU_BUILD) $(FUZZ_BUILD)
