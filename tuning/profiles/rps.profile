# rps: one knob, the loopback device's receive processing (what the kernel does for a packet a CPU sent to itself)
# steered to CPU 1: the server's answers are received on the load generator's CPU.
DESCRIPTION="receive packet steering of lo -> cpu 1"
RPS_CPUS="1"
