# memento: quick start is `make demo` and `make test` (see README.md).
#
#   make setup    install the Debian packages the project needs (root)
#   make build    configure and build into build/ (Ninja, RelWithDebInfo)
#   make test     setup + build + every test through CTest
#   make demo     setup + build + the end-to-end demo
#   make chaos    setup + build + the seeded chaos campaign (>= 1000 injected failures) and
#                 the other long randomized fault runs (not in `make test`)
#   make asan     build-asan/ (AddressSanitizer + UBSan) and its test suite (long: ~18 min build)
#   make tsan     build-tsan/ (ThreadSanitizer) and its test suite (long)
#   make format   clang-format every C++ source in place
#   make clean    remove build/

BUILD_DIR ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
CTEST_FLAGS ?=

.PHONY: all setup configure build test demo chaos asan tsan format clean

all: build

setup:
	@scripts/setup.sh

$(BUILD_DIR)/build.ninja:
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS)

configure: setup $(BUILD_DIR)/build.ninja

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) -LE chaos $(CTEST_FLAGS)

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

# Sanitizer builds (docs/testing.md). CTEST_FLAGS="-R <regex>" runs a subset.
ASAN_OPTIONS ?= detect_leaks=1:halt_on_error=1:abort_on_error=0
UBSAN_OPTIONS ?= print_stacktrace=1:halt_on_error=1
TSAN_OPTIONS ?= halt_on_error=1:second_deadlock_stack=1

build-asan/build.ninja:
	cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DMEMENTO_SANITIZE=address \
	  -DMEMENTO_BUILD_BENCH=OFF $(CMAKE_FLAGS)

build-tsan/build.ninja:
	cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DMEMENTO_SANITIZE=thread \
	  -DMEMENTO_BUILD_BENCH=OFF $(CMAKE_FLAGS)

asan: setup build-asan/build.ninja
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=$(ASAN_OPTIONS) UBSAN_OPTIONS=$(UBSAN_OPTIONS) \
	  ctest --output-on-failure -j $(JOBS) -LE chaos $(CTEST_FLAGS)

tsan: setup build-tsan/build.ninja
	cmake --build build-tsan -j $(JOBS)
	cd build-tsan && TSAN_OPTIONS=$(TSAN_OPTIONS) \
	  ctest --output-on-failure -j $(JOBS) -LE chaos $(CTEST_FLAGS)

format:
	find include src tools examples bench tests -name '*.h' -o -name '*.cc' -o -name '*.cu' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR) build-asan build-tsan
