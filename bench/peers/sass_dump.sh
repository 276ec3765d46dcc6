#!/usr/bin/env bash
# Without a GPU: the machine code (SASS) of every Hopper kernel variant of the working tree, one
# file per variant and attention kernel (bwd_block, fwd_final, fwd_state), addresses stripped,
# so that two trees compare with diff:
#   bash bench/peers/sass_dump.sh /tmp/sass-new
#   git stash; bash bench/peers/sass_dump.sh /tmp/sass-old; git stash pop
#   diff -rq /tmp/sass-old /tmp/sass-new        # no output: the GPU runs the same code
# A refactor of kernel source whose SASS is unchanged everywhere needs no device time to be
# trusted; one that changes it does. NVRTC compiles (the one the CUDA backend loads, 13.0, from
# PyPI as in .ci/run: compile.rs's write_every_variant_cubin); cuobjdump and nvdisasm from PyPI
# disassemble; all three go under target/ (about 300 MB), once.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${1:?usage: sass_dump.sh OUT_DIR}
NVRTC_DIR=target/ci-nvrtc
TOOLS=target/sass-tools
if [ ! -e "$NVRTC_DIR/nvidia/cu13/lib/libnvrtc.so.13" ]; then
  python3 -m pip install --quiet --disable-pip-version-check --target "$NVRTC_DIR" "nvidia-cuda-nvrtc==13.0.*"
fi
if [ ! -x "$TOOLS/nvidia/cu13/bin/cuobjdump" ] || [ ! -x "$TOOLS/nvidia/cu13/bin/nvdisasm" ]; then
  python3 -m pip install --quiet --disable-pip-version-check --target "$TOOLS" \
    "nvidia-cuda-cuobjdump==13.*" "nvidia-cuda-nvdisasm==13.*"
fi
export LD_LIBRARY_PATH="$PWD/$NVRTC_DIR/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$PWD/$TOOLS/nvidia/cu13/bin:$PATH"
CUBINS=$(mktemp -d)
trap 'rm -rf "$CUBINS"' EXIT
DISTFLASH_CUBIN_DIR=$CUBINS cargo test --release --quiet --lib write_every_variant_cubin -- --ignored > "$CUBINS/log" 2>&1 \
  || { cat "$CUBINS/log" >&2; exit 1; }
mkdir -p "$OUT_DIR"
for cubin in "$CUBINS"/*.cubin; do
  variant=$(basename "$cubin" .cubin)
  for kernel in bwd_block fwd_final fwd_state; do
    cuobjdump -sass -fun "$kernel" "$cubin" | grep -E '^\s+/\*[0-9a-f]{4}\*/' \
      | sed 's@/\*[0-9a-f]*\*/@@; s@;.*@@' > "$OUT_DIR/${variant}_$kernel.sass"
  done
done
echo "$(ls "$OUT_DIR" | wc -l) files in $OUT_DIR"
