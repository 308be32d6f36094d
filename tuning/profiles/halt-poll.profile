# halt-poll: one knob, a guest's idle CPU polls 200 µs before halting (cpuidle-haltpoll; skipped where the guest's
# cpuidle driver is not haltpoll).
DESCRIPTION="guest_halt_poll_ns = 200000"
HALT_POLL_NS="200000"
