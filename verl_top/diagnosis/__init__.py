"""Five-step bottleneck diagnosis: rules per step, one thresholds table, an engine with hysteresis."""
