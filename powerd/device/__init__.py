"""The hardware side of powerd: every path resolved under one root ("/" in production).

- detect.detect_board(root) -> BoardInfo: which Jetson, where its knobs live
- modespace.discover_mode_space(board, core_counts, emc_rates_hz) -> ModeSpace
- controller.Controller(board, state_dir=...): the only sysfs writer; apply/verify/recover
- baseline.restore_baseline(root, state_dir): put the admin's state back, no daemon needed
- power.PowerReader(root), power.PowerSampler(reader, interval_s): INA3221 board power
- thermal.read_temperatures(root), thermal.read_fan_pwm(root)

Submodules are imported explicitly (nothing is re-exported here) so that importing the
errors does not pull in numpy.
"""
