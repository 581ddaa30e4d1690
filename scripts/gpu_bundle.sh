#!/usr/bin/env bash
# Packs built binaries for a machine without this one's packages (the lent GPU
# machine, docs/benchmarks.md): stripped copies of the named binaries and every
# shared library they load except the C runtime and the CUDA driver (which
# must be the target machine's own). Run there with LD_LIBRARY_PATH=DIR/lib.
# Usage: scripts/gpu_bundle.sh DIR BINARY...
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 DIR BINARY..." >&2
  exit 2
fi
out=$1
shift
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
for b in "$@"; do
  [ -x "$b" ] || { echo "gpu_bundle.sh: $b is not an executable (build it first)" >&2; exit 2; }
  strip -o "$out/bin/$(basename "$b")" "$b"
  ldd "$b" | awk '/=> \//{print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*) ;;
      *) [ -e "$out/lib/$(basename "$lib")" ] || strip -o "$out/lib/$(basename "$lib")" "$lib" ;;
    esac
  done
done
du -sh "$out"
