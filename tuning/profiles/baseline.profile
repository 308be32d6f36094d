# baseline: the host as it is and berth's defaults. Knobs listed here are only recorded, not changed.
DESCRIPTION="host defaults, berth defaults"
SYSCTLS=""
GOVERNOR=""
THP=""
IRQ_CPUS=""
ENGINE_TOML=""
