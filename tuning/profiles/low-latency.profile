# low-latency: trade CPU for shorter wake-ups and fewer stalls.
DESCRIPTION="busy polling, performance governor, no THP defrag stalls, spinning executors"
SYSCTLS="net.core.busy_poll=50 net.core.busy_read=50 net.ipv4.tcp_low_latency=1 net.ipv4.tcp_autocorking=0 kernel.timer_migration=0"
GOVERNOR="performance"
THP="never"
# Steer device interrupts away from the server's CPU (cpu 0 by default in the bench): list of CPUs for IRQs.
IRQ_CPUS="1"
ENGINE_TOML='spin_before_park_us = 50
preempt_timer_ms = 10'
