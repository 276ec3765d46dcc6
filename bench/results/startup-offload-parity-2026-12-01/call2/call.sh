# binaries of 2354c50
# Device call 2: bench train over virtual workers, before their gradient sum moved to the device
# (the call ran past 600 s in the init section, whose 2-worker run is in call 4)
SECTIONS="bench init" OUT=$OUT bash bench/peers/startup_checks.sh > $OUT/console.log 2>&1
