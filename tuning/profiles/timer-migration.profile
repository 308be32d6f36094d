# timer-migration: one knob, timers stay on the CPU that armed them.
DESCRIPTION="kernel.timer_migration = 0"
SYSCTLS="kernel.timer_migration=0"
