#!/usr/bin/env bash
# Build the stack's GPU extension for the configured architectures.
set -euo pipefail
archs=${GPU_ARCHS:-gfx1030}
version=$(sed -n 's/^KERNELS_VERSION = \([0-9]*\)$/\1/p' demo_stack/__init__.py)
mkdir -p build
if ! command -v hipcc >/dev/null; then
  echo "hipcc not found: install it with: apt-get install -y hipcc libamdhip64-dev rocm-device-libs" >&2
  exit 127
fi
flags=()
for arch in ${archs//,/ }; do flags+=("--offload-arch=$arch"); done
HIP_PLATFORM=amd hipcc "${flags[@]}" -O2 -fPIC -shared -DDEMO_KERNELS_VERSION="$version" \
  kernels/demo_kernels.hip -o build/libdemo_kernels.so
echo "built build/libdemo_kernels.so for $archs (kernels version $version)"
