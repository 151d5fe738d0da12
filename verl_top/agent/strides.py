"""How often the agent takes each reading: ticks between reads, and why (measured costs).

Each value is repeated between its reads, so every tick still carries a full record. All of
them are command-line options of the agent (``--gpm-every`` ...; docs/protocol.md).
"""

# Ticks between GPM samples. On the H200 one GPM sample costs ~2.5 ms of CPU (the other reads of
# a tick ~0.2 ms), so GPM has its own stride; between samples the last window's values repeat.
GPM_EVERY = 10
SLOW_EVERY = 5  # ticks between reads of values that change slowly (temperature, memory clock)
# GPU memory and host CPU every 2nd tick: at 1 Hz on an H200 VM the memory read alone costs
# ~0.06 ms and /proc/stat ~0.14 ms (the driver and the VM answer a call made once a second
# cold; benchmarks/nvml_cold.py), and 2 s is what btop and htop refresh at by default.
MEM_EVERY = 2
CPU_EVERY = 2
PROCS_EVERY = 5  # ticks between process listings (GPU holders and the job's processes)
