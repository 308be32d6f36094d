# spin: one engine knob, an idle executor spins 50 µs before sleeping in io_uring.
DESCRIPTION="spin_before_park_us = 50"
ENGINE_TOML='spin_before_park_us = 50'
