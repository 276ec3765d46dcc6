source bench/results/norm-one-pass-2026-12-06/h100/common_ab.sh
for i in 1 2; do ab new .dev/distflash 16384; ab mlpwhole .dev/mlpwhole/distflash 16384; ab prev .dev/prev/distflash 16384; done; ab_report
