set -u
export DISTFLASH_CACHE_DIR=/tmp/dc PYTHONUNBUFFERED=1
mkdir -p $OUT/a $OUT/c $OUT/t
pack() { tar czf $OUT/results.tgz -C $OUT a c t; }
OUT=$OUT/a BIN=.dev/distflash bash bench/peers/attention_session.sh > $OUT/a/session.log 2>&1; pack
grep -E "passed|PASS|FAIL|exit" $OUT/a/session.log | head -30
OUT=$OUT/c BIN_DIR=.dev bash bench/peers/gpu_train_checks.sh > $OUT/c/console.log 2>&1; echo "train checks rc $?"; pack
OUT=$OUT/t BIN=.dev/distflash SEQS="16384 32768" LAYERS=32 REPS=3 bash bench/peers/train_session.sh > $OUT/t/console.log 2>&1; pack
.dev/distflash bench report --results $OUT/t 2>&1 | tail -12
rm -rf $OUT/a $OUT/c $OUT/t
