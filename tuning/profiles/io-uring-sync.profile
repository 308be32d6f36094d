# io-uring-sync: the engine knob sync_via = io_uring (an io-wq worker syncs while the core keeps serving) instead of
# the default blocking thread on the core's CPU; kernel untouched. Where the journal's fdatasync runs.
DESCRIPTION="segment syncs through io_uring (io-wq) instead of inline fdatasync"
SYSCTLS=""
GOVERNOR=""
THP=""
IRQ_CPUS=""
ENGINE_TOML='sync_via = "io_uring"'
