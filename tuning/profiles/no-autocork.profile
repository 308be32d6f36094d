# no-autocork: one knob, the kernel sends small writes at once instead of holding them while earlier ones queue.
DESCRIPTION="net.ipv4.tcp_autocorking = 0"
SYSCTLS="net.ipv4.tcp_autocorking=0"
