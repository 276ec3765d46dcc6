#!/usr/bin/env bash
# Builds here (the GPU machine has no Rust) what a device call runs, into .dev/ (git-ignored),
# under stable names: the GPU test binaries (tests/gpu_*.rs, run there by gpu_tests.sh with
# DISTFLASH_GPU_TESTS=1 and --include-ignored: they are ignored unless asked for), the
# `distflash` binary and the timing example (examples/gpu_timing.rs), all release builds.
#   bash bench/peers/build_gpu_tests.sh          # then a device call with carry [".dev"]
# DEST=.dev/v9 puts them elsewhere (e.g. to carry two builds side by side).
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${DEST:-.dev}
TESTS="gpu_attention gpu_ops gpu_model_attention"
mkdir -p "$DEST"
cargo build --release --bin distflash --example gpu_timing
cp target/release/distflash target/release/examples/gpu_timing "$DEST/"
args=()
for t in $TESTS; do args+=(--test "$t"); done
# Cargo names test binaries target/release/deps/NAME-HASH; its JSON messages say which is new.
cargo test --release --no-run --message-format=json "${args[@]}" \
  | sed -n 's/.*"executable":"\([^"]*\/deps\/\(gpu_[a-z_]*\)-[0-9a-f]*\)".*/\2 \1/p' \
  | while read -r name path; do cp "$path" "$DEST/$name"; done
for t in $TESTS; do
  [ -x "$DEST/$t" ] || { echo "build_gpu_tests: $DEST/$t was not built" >&2; exit 1; }
done
du -ch "$DEST/distflash" "$DEST/gpu_timing" $(for t in $TESTS; do echo "$DEST/$t"; done) \
  | tail -n 1 | sed 's/total$/in all (a device call carries at most 64 MiB)/'
