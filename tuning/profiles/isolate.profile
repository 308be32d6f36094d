# isolate: one knob, every other task that accepts a new affinity moves to CPU 1, so CPU 0 runs the server alone
# (what isolcpus= does at boot, for what a running system allows).
DESCRIPTION="other tasks moved off the server's CPU"
ISOLATE_TO="1"
