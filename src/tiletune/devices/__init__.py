"""Where candidates run: backends (cuTile, simulated, replay), worker processes, launch-plan shipping,
the correctness gate, measurement, the compile pool and compile caches, and the benchmark timer."""
