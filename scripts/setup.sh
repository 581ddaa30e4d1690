#!/usr/bin/env bash
# Installs the Debian packages memento needs. Idempotent: when everything is
# already installed it only runs dpkg-query and exits in well under a second.
#
#   scripts/setup.sh            build, test and demo dependencies, Debian's
#                               PyTorch (python3-torch, python3-numpy) for the
#                               Python package and its tests (docs/python.md),
#                               pip, setuptools and wheel for `pip install ./python`,
#                               python3-yaml for the Kubernetes recipe's test (docs/deploy.md),
#                               etcd (etcd-server, etcd-client) and cpp-httplib
#                               for the etcd store backend and its tests (docs/etcd.md),
#                               clang-14 and libclang-rt-14-dev (libFuzzer and the
#                               sanitizer runtimes) for the fuzz targets that `make test`
#                               builds and runs briefly (docs/testing.md, "Fuzzing")
#   scripts/setup.sh --no-python  without PyTorch (its tests then skip)
#   scripts/setup.sh --etcd     accepted for old command lines (etcd is in the default set)
#   scripts/setup.sh --no-fuzz  without clang-14 (`make test FUZZ=0`; fuzz_short then skips)
#   scripts/setup.sh --fuzz     accepted for old command lines (in the default set)
#
# Must run as root (or with sudo available) when something is missing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libisal-dev libxxhash-dev liburing-dev
  libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  libgloo-dev libopenblas-dev
  libgtest-dev libexpat1-dev
  pybind11-dev python3-dev
  python3-pip python3-setuptools python3-wheel python3-yaml
  python3-torch python3-numpy
  libssl-dev
  iproute2 procps
  libcpp-httplib-dev etcd-server etcd-client
  clang-14 libclang-rt-14-dev
)

for arg in "$@"; do
  case "$arg" in
    --python) ;;  # the default now; kept so old command lines work
    --no-python)
      kept=()
      for p in "${packages[@]}"; do
        case "$p" in python3-torch|python3-numpy) ;; *) kept+=("$p") ;; esac
      done
      packages=("${kept[@]}") ;;
    --etcd) ;;  # in the default set now; kept so old command lines work
    --no-fuzz)
      kept=()
      for p in "${packages[@]}"; do
        case "$p" in clang-14|libclang-rt-14-dev) ;; *) kept+=("$p") ;; esac
      done
      packages=("${kept[@]}") ;;
    --fuzz) ;;  # in the default set now; kept so old command lines work
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option '$arg' (expected --no-python, --no-fuzz, --etcd, --fuzz)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$status" = "installed" ] || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "setup.sh: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
  else
    echo "setup.sh: these Debian packages are missing and we are not root: ${missing[*]}" >&2
    echo "setup.sh: run 'sudo scripts/setup.sh' once, then retry" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
# Refresh the package lists only when they are missing or older than a day.
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mmin -1440 2>/dev/null | head -1)" ]; then
  $SUDO apt-get update -qq
fi
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup.sh: done"
