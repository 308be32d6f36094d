//! Time, passed in: every layer that needs "now" or a timer takes a `Clock` instead of reading a global, so the
//! deterministic simulation can drive the owner-core layers with a manual clock. One `Rc<dyn Clock>` per core (the
//! real one wraps the process's monotonic clock and glommio's timers; the manual one lives in a test executor).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// A boxed local future of the clock (one allocation per sleep: timers are not on the per-request path).
pub type Sleep = Pin<Box<dyn Future<Output = ()>>>;

/// Monotonic milliseconds for leases and deadlines, wall-clock milliseconds for record timestamps and retention,
/// and sleeping until a monotonic deadline; microseconds on the same monotonic clock for the journal's commit delay
/// and its queue waits.
pub trait Clock {
    /// Milliseconds on a monotonic clock that starts above 0 (leases never outlive the process).
    fn now_ms(&self) -> u64;
    /// Milliseconds since the Unix epoch.
    fn wall_ms(&self) -> u64;
    /// Resolves once `now_ms() >= deadline_ms`.
    fn sleep_until(&self, deadline_ms: u64) -> Sleep;
    /// Microseconds on the monotonic clock of `now_ms` (`now_us() / 1000 == now_ms()`).
    fn now_us(&self) -> u64;
    /// Resolves once `now_us() >= deadline_us`.
    fn sleep_until_us(&self, deadline_us: u64) -> Sleep;
}

/// The process's clocks and glommio's timers.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealClock;

/// Monotonic ms since the first call in this process, plus one (0 never appears).
pub fn monotonic_ms() -> u64 {
    monotonic_us() / 1000
}

/// Monotonic µs on the clock of `monotonic_ms` (since the first call in this process, plus one millisecond).
pub fn monotonic_us() -> u64 {
    static START_US: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let now = clock_monotonic_us();
    let start = *START_US.get_or_init(|| now);
    now.saturating_sub(start) + 1000
}

/// CLOCK_MONOTONIC in µs, the clock `std::time::Instant` and glommio's timers read, without `Instant`'s checked
/// arithmetic (read several times per request: the lease's and the take's clocks).
fn clock_monotonic_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only the timespec it is given; CLOCK_MONOTONIC exists on every Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
}

/// Monotonic ms from CLOCK_MONOTONIC_COARSE, plus one: the time of the last timer tick (1 to 4 ms behind), read
/// from the vDSO without reading the clock source (no TSC read, which costs more in a VM). For connection deadlines,
/// which are seconds long and read several times per request; leases and timers use `monotonic_ms`.
pub fn coarse_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only the timespec it is given; CLOCK_MONOTONIC_COARSE exists on every Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000 + 1
}

/// Milliseconds since the Unix epoch (0 if the system clock is before it).
pub fn wall_clock_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Clock for RealClock {
    fn now_ms(&self) -> u64 {
        monotonic_ms()
    }

    fn wall_ms(&self) -> u64 {
        wall_clock_ms()
    }

    fn sleep_until(&self, deadline_ms: u64) -> Sleep {
        let now = monotonic_ms();
        Box::pin(async move {
            if deadline_ms > now {
                glommio::timer::sleep(Duration::from_millis(deadline_ms - now)).await;
            }
        })
    }

    fn now_us(&self) -> u64 {
        monotonic_us()
    }

    fn sleep_until_us(&self, deadline_us: u64) -> Sleep {
        let now = monotonic_us();
        Box::pin(async move {
            if deadline_us > now {
                glommio::timer::sleep(Duration::from_micros(deadline_us - now)).await;
            }
        })
    }
}

/// A clock that moves only when told (`advance`, `advance_us`): sleepers whose deadline is reached are woken in
/// deadline order. Single-threaded, for the simulation and unit tests. Time is kept in microseconds.
#[derive(Default)]
pub struct ManualClock {
    now_us: Cell<u64>,
    wall_offset_ms: Cell<u64>,
    /// (deadline in µs, sequence) → the sleeper's shared state.
    sleepers: RefCell<BTreeMap<(u64, u64), Rc<SleepState>>>,
    next_seq: Cell<u64>,
}

#[derive(Default)]
struct SleepState {
    fired: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl ManualClock {
    /// Starts at monotonic `1` ms and wall-clock `wall_start_ms`.
    pub fn new(wall_start_ms: u64) -> Rc<ManualClock> {
        let clock = ManualClock::default();
        clock.now_us.set(1000);
        clock.wall_offset_ms.set(wall_start_ms);
        Rc::new(clock)
    }

    /// Moves time forward by `ms`, waking every sleeper whose deadline is now reached.
    pub fn advance(&self, ms: u64) {
        self.advance_us(ms * 1000);
    }

    /// Moves time forward by `us` microseconds, waking every sleeper whose deadline is now reached.
    pub fn advance_us(&self, us: u64) {
        self.now_us.set(self.now_us.get() + us);
        let now = self.now_us.get();
        let due: Vec<Rc<SleepState>> = {
            let mut sleepers = self.sleepers.borrow_mut();
            let later = sleepers.split_off(&(now + 1, 0));
            std::mem::replace(&mut *sleepers, later)
                .into_values()
                .collect()
        };
        for state in due {
            state.fired.set(true);
            if let Some(w) = state.waker.borrow_mut().take() {
                w.wake();
            }
        }
    }

    /// The earliest deadline anyone sleeps to, if any, in ms (rounded up: advancing to it wakes that sleeper).
    pub fn next_deadline(&self) -> Option<u64> {
        self.next_deadline_us().map(|us| us.div_ceil(1000))
    }

    /// The earliest deadline anyone sleeps to, if any, in µs.
    pub fn next_deadline_us(&self) -> Option<u64> {
        self.sleepers.borrow().keys().next().map(|(at, _)| *at)
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_us.get() / 1000
    }

    fn wall_ms(&self) -> u64 {
        self.wall_offset_ms.get() + self.now_ms()
    }

    fn sleep_until(&self, deadline_ms: u64) -> Sleep {
        self.sleep_until_us(deadline_ms.saturating_mul(1000))
    }

    fn now_us(&self) -> u64 {
        self.now_us.get()
    }

    fn sleep_until_us(&self, deadline_us: u64) -> Sleep {
        let state = Rc::new(SleepState::default());
        if deadline_us <= self.now_us.get() {
            state.fired.set(true);
        } else {
            let seq = self.next_seq.get();
            self.next_seq.set(seq + 1);
            self.sleepers
                .borrow_mut()
                .insert((deadline_us, seq), state.clone());
        }
        Box::pin(ManualSleep { state })
    }
}

struct ManualSleep {
    state: Rc<SleepState>,
}

impl Future for ManualSleep {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.state.fired.get() {
            Poll::Ready(())
        } else {
            *self.state.waker.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_sleepers_wake_at_their_deadline_and_not_before() {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .make()
            .unwrap()
            .run(async {
                let clock = ManualClock::new(1_000_000);
                let order = Rc::new(RefCell::new(Vec::new()));
                for (name, at) in [("late", 50u64), ("early", 10), ("now", 1)] {
                    let (clock, order) = (clock.clone(), order.clone());
                    glommio::spawn_local(async move {
                        clock.sleep_until(at).await;
                        order.borrow_mut().push((name, clock.now_ms()));
                    })
                    .detach();
                }
                futures_lite::future::yield_now().await;
                assert_eq!(*order.borrow(), vec![("now", 1)]);
                clock.advance(8);
                futures_lite::future::yield_now().await;
                assert_eq!(order.borrow().len(), 1, "nothing due at 9");
                clock.advance(1);
                futures_lite::future::yield_now().await;
                assert_eq!(order.borrow()[1], ("early", 10));
                assert_eq!(clock.next_deadline(), Some(50));
                clock.advance(100);
                futures_lite::future::yield_now().await;
                assert_eq!(order.borrow()[2], ("late", 110));
                assert_eq!(clock.wall_ms(), 1_000_110);
            });
    }
}

#[cfg(test)]
mod coarse_tests {
    #[test]
    fn the_coarse_clock_never_goes_back_and_never_reads_zero() {
        let mut last = super::coarse_ms();
        assert!(last > 0);
        for _ in 0..10_000 {
            let now = super::coarse_ms();
            assert!(now >= last, "{now} < {last}");
            last = now;
        }
    }
}
