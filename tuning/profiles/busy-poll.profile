# busy-poll: one knob, sockets spin on the device queue for up to 50 µs instead of sleeping for an interrupt.
DESCRIPTION="net.core.busy_poll/busy_read = 50 us"
SYSCTLS="net.core.busy_poll=50 net.core.busy_read=50"
