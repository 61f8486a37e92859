#!/usr/bin/env bash
set -euo pipefail
if [ "$(cat mode 2>/dev/null)" = build-fail ]; then
  echo "tiny.c:1: error: this commit does not build (on purpose)" >&2
  exit 1
fi
if [ "$(cat mode 2>/dev/null)" = build-dirty ]; then
  echo "/* generated */" >> tiny.c
fi
if [ "$(cat mode 2>/dev/null)" = slow-build ]; then
  echo "building slowly"; sleep 20
fi
mkdir -p build
cc -shared -fPIC -O2 -o build/libtiny.so tiny.c
echo "built build/libtiny.so"
