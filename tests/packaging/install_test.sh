#!/usr/bin/env bash
# packaging_install_test (tests/packaging/CMakeLists.txt).
#   install_test.sh BUILD_DIR CONSUMER_SRC CXX
# Installs BUILD_DIR into a temporary prefix, checks the installed files, and
# builds and runs CONSUMER_SRC against that prefix with find_package(memento)
# and with pkg-config. Writes nothing into BUILD_DIR but cmake's
# install_manifest.txt.
set -euo pipefail
build_dir=$1 consumer_src=$2 cxx=$3
base=${MEMENTO_TEST_TMPDIR:-/tmp}
mkdir -p "$base"
tmp=$(mktemp -d "$base/packaging.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
fail() { echo "packaging_install_test: FAIL: $*" >&2; exit 1; }

cmake --install "$build_dir" --prefix "$prefix" >"$tmp/install.log" || {
  cat "$tmp/install.log" >&2; fail "cmake --install failed"; }

for f in include/memento/client.h include/memento/status.h include/memento/types.h \
         include/memento/deadline.h lib/libmemento.so bin/memento \
         lib/cmake/memento/mementoConfig.cmake lib/cmake/memento/mementoConfigVersion.cmake \
         lib/cmake/memento/mementoTargets.cmake lib/pkgconfig/memento.pc; do
  [ -e "$prefix/$f" ] || fail "the install is missing $f (installed: $(cd "$prefix" && find . -type f | tr '\n' ' '))"
done
# The library exports the public API (not only the version function).
# (nm's output goes to a file first: grep -q would end the pipe early and
# pipefail would report nm's SIGPIPE.)
nm -D --defined-only "$prefix/lib/libmemento.so" >"$tmp/symbols.txt"
grep -q 'memento6Client7Connect' "$tmp/symbols.txt" ||
  fail "libmemento.so does not export memento::Client::Connect"
# The installed tool finds its library and runs.
"$prefix/bin/memento" --version >"$tmp/version.txt" || fail "installed bin/memento --version failed"

# 1. CMake: find_package(memento) from the prefix only.
cmake -S "$consumer_src" -B "$tmp/cmake-build" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF >"$tmp/cmake.log" 2>&1 || {
  cat "$tmp/cmake.log" >&2; fail "configuring the consumer with find_package(memento) failed"; }
cmake --build "$tmp/cmake-build" >"$tmp/build.log" 2>&1 || {
  cat "$tmp/build.log" >&2; fail "building the consumer with find_package(memento) failed"; }
out=$("$tmp/cmake-build/consumer" "$tmp/no-agent") ||
  fail "the find_package consumer exited $? (>128: killed by signal; a libmemento.so older than the installed headers crashes this way: build every target before installing)"
echo "find_package consumer: $out"
ldd "$tmp/cmake-build/consumer" >"$tmp/ldd.txt"
grep -q "$prefix/lib/libmemento.so" "$tmp/ldd.txt" ||
  fail "the find_package consumer does not load the installed libmemento.so: $(ldd "$tmp/cmake-build/consumer")"

# 2. pkg-config.
flags=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs memento) ||
  fail "pkg-config does not find memento.pc"
"$cxx" -o "$tmp/pc-consumer" "$consumer_src/consumer.cc" $flags || fail "building with pkg-config flags ($flags) failed"
out=$(LD_LIBRARY_PATH="$prefix/lib" "$tmp/pc-consumer" "$tmp/no-agent") ||
  fail "the pkg-config consumer exited $?"
echo "pkg-config consumer: $out"
echo "packaging_install_test: OK ($(cat "$tmp/version.txt"))"
