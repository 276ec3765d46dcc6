export PATH=/opt/torch/.venv/bin:$PATH
D=.dev-masks
BIN_DIR=$D TESTS="gpu_attention gpu_model_attention" LOG=$OUT/gpu_tests.log bash $D/peers/gpu_tests.sh
grep -E "^test |test result|FAILED|panicked" $OUT/gpu_tests.log | grep -v " ok$" | head -30
sed 's#bench/peers/mask_bench.py#.dev-masks/peers/mask_bench.py#g' $D/peers/mask_bench.sh > /tmp/mb.sh
BIN=$D/distflash bash /tmp/mb.sh > $OUT/mask_bench.out 2>&1
tail -40 $OUT/mask_bench.out
