# timer-slack: one engine knob, the executor threads' timer slack at 1 ns instead of the kernel's 50 µs.
DESCRIPTION="timer_slack_ns = 1"
ENGINE_TOML='timer_slack_ns = 1'
