# throughput: bigger queues and batches; more work per wake-up.
DESCRIPTION="deeper rings and backlogs, THP always, autocorking on"
SYSCTLS="net.core.somaxconn=4096 net.ipv4.tcp_max_syn_backlog=4096 net.core.netdev_max_backlog=16384 net.ipv4.tcp_autocorking=1 vm.dirty_background_ratio=5"
GOVERNOR="performance"
THP="always"
IRQ_CPUS=""
ENGINE_TOML='ring_depth = 512
io_memory_bytes = 33554432
listen_backlog = 4096
mesh_channel_depth = 4096'
