#!/usr/bin/env bash
# Build the example WASM tools (examples/wasm_tools/*.c) into OUT (default examples/wasm_tools/build)
# with Debian's clang + wasi-libc. Usage: scripts/build_wasm_tools.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-examples/wasm_tools/build}
mkdir -p "$out"
for src in examples/wasm_tools/*.c; do
  name=$(basename "$src" .c)
  clang --target=wasm32-wasi --sysroot=/usr -O2 -o "$out/$name.wasm" "$src"
done
echo "$out"
