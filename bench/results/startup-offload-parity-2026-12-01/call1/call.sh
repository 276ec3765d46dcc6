# Device call 1 (nvidia-h200), binaries of cc8c6cf (with startup_checks.sh of 2354c50) built by build_gpu_tests.sh:
OUT=$OUT bash bench/peers/startup_checks.sh > $OUT/console.log 2>&1
# (its `bench` section failed: bench train took --workers only with --estimate then; fixed after)
