#!/usr/bin/env bash
# tools/fetch-gpu-debs.sh [--runtime] [extra-package ...] — run from the repository root on a Debian
# 12 machine with apt. Downloads the libraries an offline GPU machine lacks (it has CUDA, NCCL and a
# compiler, but no package access) into .gpu-debs/ (ignored by git), and writes .gpu-debs/env.sh
# beside them. On the GPU machine, with .gpu-debs/ copied along:  . .gpu-debs/env.sh && make ...
# env.sh unpacks the packages under /tmp/deps (never into /) and points the compiler, linker,
# loader and pkg-config there.
# --runtime: only the shared libraries, no -dev packages, into .gpu-rt/ (its own env.sh): enough to
# run binaries built elsewhere (tools/gpu-pack.sh), and about a fifth of the bytes, which matters
# when the copy to the GPU machine has a size limit.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=.gpu-debs
if [ "${1:-}" = --runtime ]; then dir=.gpu-rt; shift; fi
# gnutls and the libraries its pkg-config file requires: libmicrohttpd.pc names gnutls, and
# without every .pc of that chain `pkg-config --exists libmicrohttpd` fails and the gateway is not built.
# python3-msgpack: the Python client (tools/troupe_client.py), which scenario scripts drive; built for
# Debian's Python 3.11, its C extension does not load under another Python and msgpack falls back
# to its pure-Python codec.
pkgs="libzmq5 libzmq3-dev libsodium23 libpgm-5.3-0 libnorm1 libbsd0 libmd0
      libmsgpackc2 libmsgpack-dev libcyaml1 libcyaml-dev libyaml-0-2 libyaml-dev
      libjansson4 libjansson-dev libonig5 libonig-dev libcmocka0 libcmocka-dev
      libxxhash0 libxxhash-dev libncurses-dev libncurses6 libncursesw6 libtinfo6
      libmicrohttpd12 libmicrohttpd-dev
      libgnutls30 libgnutls28-dev nettle-dev libnettle8 libhogweed6 libtasn1-6 libtasn1-6-dev
      libidn2-0 libidn2-dev libp11-kit0 libp11-kit-dev libunistring2 libgmp10 libffi8
      python3-msgpack $*"
if [ $dir = .gpu-rt ]; then pkgs=$(for p in $pkgs; do case $p in *-dev) ;; *) echo $p ;; esac; done); fi
mkdir -p $dir
[ -n "$(find /var/lib/apt/lists -name '*Packages*' 2>/dev/null | head -1)" ] || apt-get update -qq
(cd $dir && apt-get download $pkgs 2>&1 | grep -v 'Download is performed unsandboxed' || true)
sed "s|@DIR@|$dir|g" > $dir/env.sh <<'ENV'
# Sourced on the offline GPU machine from the repository root (written by tools/fetch-gpu-debs.sh).
mkdir -p /tmp/deps
for f in @DIR@/*.deb; do dpkg -x "$f" /tmp/deps; done
export CPATH=/tmp/deps/usr/include${CPATH:+:$CPATH}
export LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}
export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu:/tmp/deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PKG_CONFIG_SYSROOT_DIR=/tmp/deps
export PYTHONPATH=/tmp/deps/usr/lib/python3/dist-packages${PYTHONPATH:+:$PYTHONPATH}
export PKG_CONFIG_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu/pkgconfig:/tmp/deps/usr/share/pkgconfig
# NVLink multicast (NVLS) stays off: the lent multi-GPU machines do not support it.
export NCCL_NVLS_ENABLE=0
ENV
echo "fetch-gpu-debs: $(ls $dir/*.deb | wc -l) packages in $dir ($(du -sh $dir | cut -f1)); then: . $dir/env.sh"
