# memento: quick start is `make demo` and `make test` (see README.md).
#
#   make setup    install the Debian packages the project needs (root)
#   make build    configure and build into build/ (Ninja, RelWithDebInfo)
#   make test     setup + build + every test through CTest
#   make demo     setup + build + the end-to-end demo
#   make chaos    setup + build + the seeded chaos campaign (>= 1000 injected failures) and
#                 the other long randomized fault runs (not in `make test`)
#   make fuzz     clang-14 + libFuzzer build in build-fuzz/, each target FUZZ_SECONDS (600)
#                 (`make test` builds build-fuzz/ too and fuzzes each target 5 s; FUZZ=0 skips)
#   make asan     build-asan/ (AddressSanitizer + UBSan) and its test suite (long: ~18 min build)
#   make tsan     build-tsan/ (ThreadSanitizer) and the tests it has been run clean on
#                 (TSAN_TESTS; TSAN_TESTS=all: the whole suite; long)
#   make thread-safety  Clang -Wthread-safety -Werror over every translation unit of build/
#   make format   clang-format every C++ source in place
#   make clean    remove build/

BUILD_DIR ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
CTEST_FLAGS ?=

.PHONY: all setup configure build test demo chaos fuzz asan tsan thread-safety format clean

all: build

setup:
	@scripts/setup.sh $(if $(filter 0,$(FUZZ)),--no-fuzz)

$(BUILD_DIR)/build.ninja:
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS)

configure: setup $(BUILD_DIR)/build.ninja

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# `make test` also builds the libFuzzer tree build-fuzz/ (clang-14, ASan +
# UBSan, only the decoders the fuzz targets link: about 3 minutes of 2 cores
# the first time, docs/testing.md) and its fuzz_short test fuzzes each target
# for 5 s. Without clang-14 and libFuzzer fuzz_short is skipped
# (scripts/setup.sh installs them); FUZZ=0 neither installs, builds nor runs it.
FUZZ ?= 1
FUZZ_SECONDS ?= 600
FUZZ_CTEST_FLAGS = $(if $(filter 0,$(FUZZ)),-E '^fuzz_short$$')

test: build
	@if [ "$(FUZZ)" != 0 ] && scripts/fuzz.sh check 2>/dev/null; then JOBS=$(JOBS) scripts/fuzz.sh build; fi
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) -LE chaos $(FUZZ_CTEST_FLAGS) $(CTEST_FLAGS)

demo: build
	$(BUILD_DIR)/tools/memento demo

# The seeded chaos campaign (scripts/chaos.py, docs/testing.md), then the
# chaos-labelled tests. CHAOS_FLAGS="--run-seed 0x..." reruns one run.
CHAOS_SEED ?= 1
CHAOS_FAILURES ?= 1000
CHAOS_FLAGS ?=
chaos: build
	nice -n 19 scripts/chaos.py --build $(BUILD_DIR) --seed $(CHAOS_SEED) \
	  --failures $(CHAOS_FAILURES) --work-dir $(BUILD_DIR)/chaos $(CHAOS_FLAGS)
	cd $(BUILD_DIR) && MEMENTO_CHAOS=1 ctest --output-on-failure -L chaos $(CTEST_FLAGS)

fuzz:
	scripts/setup.sh --fuzz
	JOBS=$(JOBS) scripts/fuzz.sh build
	scripts/fuzz.sh run $(FUZZ_SECONDS)

# Sanitizer builds (docs/testing.md). CTEST_FLAGS="-R <regex>" runs a subset.
ASAN_OPTIONS ?= detect_leaks=1:halt_on_error=1:abort_on_error=0
UBSAN_OPTIONS ?= print_stacktrace=1:halt_on_error=1
TSAN_OPTIONS ?= halt_on_error=1:second_deadlock_stack=1
# The test binaries ThreadSanitizer has been run clean on (docs/testing.md,
# "Sanitizer runs of record"); `make tsan` builds and runs only these (the
# rest of the suite is not yet clean-checked: planned). TSAN_TESTS=all builds
# everything and runs `ctest -LE chaos`.
TSAN_TESTS ?= common_test coord_test net_test shm_test has_test snap_test aor_test \
  client_has_test agent_peer_service_test agent_aor_test \
  agent_cluster_rollback_test
# Sanitized builds compile at -O1 with line tables only (-g1): the sanitizers'
# recommended level, about half the compile time of -O2 -g (measured on
# src/agent/assemble.cc under ASan: 15 s vs 29 s of CPU), and the reports
# still name file:line.
SAN_OPT_FLAGS ?= -O1 -g1 -DNDEBUG
SAN_CMAKE_FLAGS = -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMEMENTO_BUILD_BENCH=OFF \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$(SAN_OPT_FLAGS)" -DCMAKE_C_FLAGS_RELWITHDEBINFO="$(SAN_OPT_FLAGS)"

build-asan/build.ninja:
	cmake -S . -B build-asan -G Ninja -DMEMENTO_SANITIZE=address $(SAN_CMAKE_FLAGS) $(CMAKE_FLAGS)

build-tsan/build.ninja:
	cmake -S . -B build-tsan -G Ninja -DMEMENTO_SANITIZE=thread $(SAN_CMAKE_FLAGS) $(CMAKE_FLAGS)

asan: setup build-asan/build.ninja
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=$(ASAN_OPTIONS) UBSAN_OPTIONS=$(UBSAN_OPTIONS) \
	  ctest --output-on-failure -j $(JOBS) -LE chaos $(CTEST_FLAGS)

empty :=
space := $(empty) $(empty)
ifeq ($(TSAN_TESTS),all)
TSAN_BUILD_TARGETS :=
TSAN_CTEST_SELECT := -LE chaos
else
TSAN_BUILD_TARGETS := --target $(TSAN_TESTS)
TSAN_CTEST_SELECT := -R '^($(subst $(space),|,$(strip $(TSAN_TESTS))))$$'
endif

tsan: setup build-tsan/build.ninja
	cmake --build build-tsan -j $(JOBS) $(TSAN_BUILD_TARGETS)
	cd build-tsan && TSAN_OPTIONS=$(TSAN_OPTIONS) \
	  ctest --output-on-failure -j $(JOBS) $(TSAN_CTEST_SELECT) $(CTEST_FLAGS)

# Clang's thread-safety analysis (the GUARDED_BY/REQUIRES annotations of
# src/common/mutex.h) over every C++ translation unit of $(BUILD_DIR): clang++
# -fsyntax-only -Wthread-safety -Werror on compile_commands.json, no second
# build tree (scripts/thread_safety.py; Debian's clang-14).
thread-safety: $(BUILD_DIR)/build.ninja
	scripts/thread_safety.py --build $(BUILD_DIR) -j $(JOBS)

format:
	find include src tools examples bench tests -name '*.h' -o -name '*.cc' -o -name '*.cu' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR) build-asan build-tsan build-fuzz
