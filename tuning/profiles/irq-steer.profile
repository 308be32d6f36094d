# irq-steer: one knob, every device interrupt that accepts it goes to CPU 1 (the load generator's), off the server's.
DESCRIPTION="IRQ affinity -> cpu 1"
IRQ_CPUS="1"
