//! Interrupts (SIGINT, SIGTERM) as an injected stream: the process's handlers count them; whoever waits
//! takes one (or, for concurrent watches, sees it without taking it). A watch gets an [`Interrupts`]
//! handle, so tests can give it one that never fires.

use std::sync::atomic::{AtomicUsize, Ordering};

static INTERRUPTS: AtomicUsize = AtomicUsize::new(0);

/// The last of SIGINT/SIGTERM received (0: none).
static LAST_SIGNAL: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn on_interrupt(sig: libc::c_int) {
    LAST_SIGNAL.store(sig, Ordering::SeqCst);
    INTERRUPTS.fetch_add(1, Ordering::SeqCst);
}

/// Whether the last interrupt was SIGTERM (a service manager's orderly stop) rather than Ctrl-C.
pub fn last_interrupt_was_sigterm() -> bool {
    LAST_SIGNAL.load(Ordering::SeqCst) == libc::SIGTERM
}

/// SIGINT and SIGTERM are counted, not fatal, while vigil watches: the first stops the server (or
/// ends the wait), a second one during a stop kills at once.
pub fn install_interrupt_handlers() {
    // SAFETY: the handler only touches an atomic.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_interrupt as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
        libc::sigaction(libc::SIGTERM, &sa, std::ptr::null_mut());
    }
}

static CONSUMED: AtomicUsize = AtomicUsize::new(0);

/// Takes one pending interrupt (SIGINT/SIGTERM since the process started), if any: each interrupt is
/// acted on once, by whoever waits for it (the watch, the stop, the foreground loop).
pub fn take_interrupt() -> bool {
    let n = INTERRUPTS.load(Ordering::SeqCst);
    let c = CONSUMED.load(Ordering::SeqCst);
    if n > c {
        CONSUMED.store(n, Ordering::SeqCst);
        return true;
    }
    false
}

/// Resolves when an interrupt is pending: taking it, or (`shared`: one of several concurrent
/// watches, all of which must see it) leaving it pending.
pub async fn interrupt(shared: bool) {
    if !shared {
        return next_interrupt().await;
    }
    while INTERRUPTS.load(Ordering::SeqCst) <= CONSUMED.load(Ordering::SeqCst) {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Resolves when an interrupt is pending, and takes it.
pub async fn next_interrupt() {
    while !take_interrupt() {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The interrupts a watch listens to: the process's signals, or none (tests, embedded use).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Interrupts {
    #[default]
    Process,
    /// Never fires.
    #[allow(dead_code)]
    Noop,
}

impl Interrupts {
    /// Resolves on the next interrupt (`shared`: seen by several concurrent watches, left pending).
    pub async fn recv(self, shared: bool) {
        match self {
            Interrupts::Process => interrupt(shared).await,
            Interrupts::Noop => std::future::pending().await,
        }
    }

    /// Whether the interrupt that ended a watch was SIGTERM (an orderly stop by a service manager).
    pub fn was_sigterm(self) -> bool {
        self == Interrupts::Process && last_interrupt_was_sigterm()
    }
}
