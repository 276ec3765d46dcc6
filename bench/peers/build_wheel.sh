#!/usr/bin/env bash
# Builds here (the GPU machine has no Rust) the Python package's wheel into .dev/ (git-ignored):
# release, abi3 for CPython >= 3.9, so it installs on whatever Python the GPU machine has.
#   bash bench/peers/build_wheel.sh          # then a device call with carry [".dev"]
# maturin comes from PyPI if it is not installed. DEST=.dev/v2 puts the wheel elsewhere.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${DEST:-.dev}
mkdir -p "$DEST"
command -v maturin >/dev/null || python3 -m pip install --quiet --disable-pip-version-check "maturin>=1.9,<2"
rm -f "$DEST"/distflash-*.whl
maturin build --release --manifest-path python/Cargo.toml --out "$DEST" -j 1
ls -l "$DEST"/distflash-*.whl
