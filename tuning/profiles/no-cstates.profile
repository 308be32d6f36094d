# no-cstates: one knob, /dev/cpu_dma_latency held at 0 µs while the bench runs: no CPU enters an idle state deeper
# than polling (PM QoS).
DESCRIPTION="cpu_dma_latency = 0 (no deep C-states)"
PM_QOS_US="0"
