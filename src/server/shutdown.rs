//! Graceful shutdown: a signal thread flips one flag, every core stops accepting and drains its connections, then
//! all cores meet at a barrier (so forwarded work still finds its owner), flush their frontiers, close their logs and
//! meet again before returning.

use event_listener::Event;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// Shared by the signal thread and every core.
pub struct Shutdown {
    cores: usize,
    triggered: AtomicBool,
    event: Event,
    drained: AtomicUsize,
    drained_event: Event,
    closed: AtomicUsize,
    closed_event: Event,
}

impl Shutdown {
    pub fn new(cores: usize) -> Shutdown {
        Shutdown {
            cores,
            triggered: AtomicBool::new(false),
            event: Event::new(),
            drained: AtomicUsize::new(0),
            drained_event: Event::new(),
            closed: AtomicUsize::new(0),
            closed_event: Event::new(),
        }
    }

    /// Starts shutdown (idempotent).
    pub fn trigger(&self) {
        self.triggered.store(true, Ordering::Release);
        self.event.notify(usize::MAX);
    }

    pub fn is_triggered(&self) -> bool {
        self.triggered.load(Ordering::Acquire)
    }

    /// Register before checking `is_triggered`.
    pub fn listen(&self) -> event_listener::EventListener {
        self.event.listen()
    }

    /// This core has drained its connections; waits until every core has.
    pub async fn drained_and_wait(&self) {
        barrier(&self.drained, &self.drained_event, self.cores).await;
    }

    /// This core has closed its partitions; waits until every core has.
    pub async fn closed_and_wait(&self) {
        barrier(&self.closed, &self.closed_event, self.cores).await;
    }
}

/// Counts this core in and waits until `cores` cores have arrived.
pub async fn barrier(count: &AtomicUsize, event: &Event, cores: usize) {
    count.fetch_add(1, Ordering::AcqRel);
    event.notify(usize::MAX);
    loop {
        let listener = event.listen();
        if count.load(Ordering::Acquire) >= cores {
            return;
        }
        listener.await;
    }
}

/// A thread that turns SIGTERM or SIGINT into `trigger`; a second signal exits at once.
pub fn install_signal_handler(stop: Arc<Shutdown>) -> Result<(), String> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])
        .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    std::thread::Builder::new()
        .name("berth-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                if stop.is_triggered() {
                    tracing::warn!(signal, "second signal: exiting now");
                    std::process::exit(130);
                }
                tracing::info!(
                    signal,
                    "shutting down: draining connections, flushing frontiers"
                );
                stop.trigger();
            }
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    Ok(())
}
