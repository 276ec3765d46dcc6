source bench/results/norm-one-pass-2026-12-06/h100/common_ab.sh
for i in 1 2; do ab new .dev/distflash 32768; ab mlpwhole .dev/mlpwhole/distflash 32768; done; ab prev .dev/prev/distflash 32768; ab_report
