#!/usr/bin/env bash
# Fuzzing with Debian's clang-14 and libFuzzer (docs/testing.md, "Fuzzing").
#
#   scripts/fuzz.sh check          exit 0 when clang++-14 and libFuzzer are installed, 77 if not
#   scripts/fuzz.sh build          configure $FUZZ_BUILD_DIR (default build-fuzz: clang-14,
#                                  -DMEMENTO_FUZZ=ON, ASan + UBSan) and build the fuzz targets
#   scripts/fuzz.sh run SECONDS [TARGET...]
#                                  fuzz each target (default: all) for SECONDS over its kept
#                                  corpus fuzz/corpus/<target>; new inputs go to
#                                  $FUZZ_BUILD_DIR/fuzz-corpus, crashes to .../fuzz-artifacts
#   scripts/fuzz.sh short          every target for $FUZZ_SHORT_SECONDS (default 5) when
#                                  $FUZZ_BUILD_DIR was configured (brought up to date first, so
#                                  stale binaries never run); exit 77 (skipped) when it was not
#                                  (ctest fuzz_short, in `make test`)
# FUZZ_OPT_FLAGS (-O1 -g0 -DNDEBUG) sets the build's optimization; FUZZ_UNIT_TIMEOUT the
# seconds one input may take before libFuzzer calls it a hang (run: 10, short: 60).
#
# A crash leaves its input in $FUZZ_BUILD_DIR/fuzz-artifacts/<target>-crash-*; once fixed, copy
# it into fuzz/corpus/<target>/ so the replay test (ctest fuzz_replay_<target>) keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_BUILD_DIR=${FUZZ_BUILD_DIR:-build-fuzz}
CXX_FUZZ=${CXX_FUZZ:-clang++-14}
CC_FUZZ=${CC_FUZZ:-clang-14}
JOBS=${JOBS:-$(nproc)}
# -O1 without debug information: ASan's recommended level, and about 0.7x the
# compile time of RelWithDebInfo's -O2 -g (src/tier/format.cc under ASan +
# UBSan + coverage: 31 s against 42 s of CPU). Reports name functions, not
# lines; FUZZ_OPT_FLAGS="-O1 -gline-tables-only -DNDEBUG" for lines.
FUZZ_OPT_FLAGS=${FUZZ_OPT_FLAGS:--O1 -g0 -DNDEBUG}

have_libfuzzer() {
  command -v "$CXX_FUZZ" >/dev/null 2>&1 || return 1
  local lib
  lib=$("$CXX_FUZZ" -print-file-name=libclang_rt.fuzzer-x86_64.a 2>/dev/null || true)
  [ -f "$lib" ] || lib=$("$CXX_FUZZ" --print-runtime-dir 2>/dev/null)/libclang_rt.fuzzer-x86_64.a
  [ -f "$lib" ]
}

targets() {
  sed -n 's/^  \([a-z_]*\):memento_[a-z]*)\{0,1\}$/\1/p' fuzz/CMakeLists.txt
}

cmd=${1:-}
case "$cmd" in
  check)
    if have_libfuzzer; then exit 0; fi
    echo "fuzz.sh: $CXX_FUZZ with libFuzzer is not installed (scripts/setup.sh --fuzz)" >&2
    exit 77
    ;;
  build)
    if ! have_libfuzzer; then
      echo "fuzz.sh: $CXX_FUZZ with libFuzzer is not installed (scripts/setup.sh --fuzz)" >&2
      exit 1
    fi
    launcher=()
    if command -v ccache >/dev/null 2>&1; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
    # Configured every time (a few seconds), so that a tree configured by an
    # older version of this script takes today's flags.
    cmake -S . -B "$FUZZ_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_COMPILER="$CXX_FUZZ" -DCMAKE_C_COMPILER="$CC_FUZZ" "${launcher[@]}" \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$FUZZ_OPT_FLAGS" \
      -DCMAKE_C_FLAGS_RELWITHDEBINFO="$FUZZ_OPT_FLAGS" \
      -DMEMENTO_FUZZ=ON -DMEMENTO_BUILD_TESTS=OFF -DMEMENTO_BUILD_BENCH=OFF \
      -DMEMENTO_WITH_CUDA=OFF >/dev/null
    cmake --build "$FUZZ_BUILD_DIR" -j "$JOBS" --target fuzz_all
    ;;
  run|short)
    if [ "$cmd" = short ]; then
      seconds=${FUZZ_SHORT_SECONDS:-5}
      # In `make test`, beside the suite on a loaded machine: one input is a
      # hang only past a minute (libFuzzer's -timeout), not past the 10 s of
      # the long runs.
      unit_timeout=${FUZZ_UNIT_TIMEOUT:-60}
      shift
      if ! have_libfuzzer; then
        echo "fuzz.sh: skipped: $CXX_FUZZ with libFuzzer is not installed" >&2
        exit 77
      fi
      if [ ! -f "$FUZZ_BUILD_DIR/build.ninja" ]; then
        echo "fuzz.sh: skipped: $FUZZ_BUILD_DIR is not built (scripts/fuzz.sh build)" >&2
        exit 77
      fi
      cmake --build "$FUZZ_BUILD_DIR" -j "$JOBS" --target fuzz_all >/dev/null
    else
      seconds=${2:?usage: scripts/fuzz.sh run SECONDS [TARGET...]}
      unit_timeout=${FUZZ_UNIT_TIMEOUT:-10}
      shift 2
    fi
    list=("$@")
    if [ ${#list[@]} -eq 0 ]; then mapfile -t list < <(targets); fi
    mkdir -p "$FUZZ_BUILD_DIR/fuzz-artifacts"
    failed=()
    for t in "${list[@]}"; do
      bin="$FUZZ_BUILD_DIR/fuzz/fuzz_$t"
      [ -x "$bin" ] || { echo "fuzz.sh: $bin is missing (scripts/fuzz.sh build)" >&2; exit 1; }
      work="$FUZZ_BUILD_DIR/fuzz-corpus/$t"
      mkdir -p "$work" "fuzz/corpus/$t"
      echo "fuzz.sh: $t for ${seconds} s"
      if ! MEMENTO_LOG_LEVEL=${MEMENTO_LOG_LEVEL:-off} ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
        UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} \
        "$bin" -max_total_time="$seconds" -timeout="$unit_timeout" -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$FUZZ_BUILD_DIR/fuzz-artifacts/$t-" "$work" "fuzz/corpus/$t" \
        > "$FUZZ_BUILD_DIR/fuzz-$t.log" 2>&1; then
        failed+=("$t")
        echo "fuzz.sh: $t FAILED; log $FUZZ_BUILD_DIR/fuzz-$t.log:" >&2
        grep -a -E "ERROR|SUMMARY|Test unit written" "$FUZZ_BUILD_DIR/fuzz-$t.log" | head -5 >&2 || true
      else
        grep -a -E "stat::number_of_executed_units|stat::new_units_added" "$FUZZ_BUILD_DIR/fuzz-$t.log" \
          | tr '\n' ' ' | sed 's/^/  /'; echo
      fi
    done
    if [ ${#failed[@]} -gt 0 ]; then
      echo "fuzz.sh: crashes in: ${failed[*]} (inputs in $FUZZ_BUILD_DIR/fuzz-artifacts)" >&2
      exit 1
    fi
    ;;
  *)
    sed -n '2,19p' "$0"
    [ "$cmd" = -h ] || [ "$cmd" = --help ] && exit 0
    exit 2
    ;;
esac
