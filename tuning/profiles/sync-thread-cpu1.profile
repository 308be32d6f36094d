# sync-thread-cpu1: where the journal's fdatasync runs, one engine knob: its blocking thread on CPU 1 (the load
# generator's) instead of the core's own CPU.
DESCRIPTION="blocking_cpus = [1]"
ENGINE_TOML='blocking_cpus = [1]'
