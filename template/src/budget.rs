//! The work one resource's templates may do together, and how a caller stops
//! them.
//!
//! Every render has its own fuel ([`Limits::fuel`](crate::Limits)), but a
//! resource renders many templates (each entry of each target), so one
//! resource could otherwise do a thousand renders' worth of work. A
//! [`Budget`] is the fuel all the renders of one resource share
//! ([`Limits::resource_fuel`](crate::Limits)): each render may use at most
//! the smaller of its own fuel and what is left of the budget, and what it
//! used is taken from the budget afterwards. Once the budget is spent, the
//! next render fails at once.
//!
//! A [`Canceller`] stops the renders of a budget from another thread (the
//! caller's deadline passed): the engines look at it at every step of a Go
//! template, at every helper call of both engines and inside long helper
//! loops, and the render fails with
//! [`ErrorKind::Cancelled`](crate::ErrorKind::Cancelled).
//!
//! While a render runs, its canceller is held in a thread-local so that the
//! helpers (called by minijinja, which knows nothing of budgets) can see it.

use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The fuel one resource's renders share (all its targets and entries), and
/// a flag to stop them.
///
/// Build it with [`Engine::budget`](crate::Engine::budget), pass it to every
/// [`Engine::render_in`](crate::Engine::render_in) of the resource, and keep
/// a [`Canceller`] to stop the renders when a deadline passes. It is `Send`:
/// it can be moved into the thread that renders.
#[derive(Debug)]
pub struct Budget {
    initial: u64,
    remaining: u64,
    canceller: Canceller,
}

impl Budget {
    /// A budget of `fuel`.
    pub fn new(fuel: u64) -> Budget {
        Budget {
            initial: fuel,
            remaining: fuel,
            canceller: Canceller::default(),
        }
    }

    /// The fuel left.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// The fuel used so far.
    pub fn used(&self) -> u64 {
        self.initial - self.remaining
    }

    /// A handle that stops the renders of this budget (from any thread).
    pub fn canceller(&self) -> Canceller {
        self.canceller.clone()
    }

    /// The fuel the next render may use: its own fuel, or less when the
    /// budget has less left.
    pub(crate) fn allowance(&self, per_render: u64) -> u64 {
        per_render.min(self.remaining)
    }

    /// Takes `fuel` from the budget (all that is left when it is more).
    pub(crate) fn spend(&mut self, fuel: u64) {
        self.remaining = self.remaining.saturating_sub(fuel);
    }

    /// Whether the renders of this budget were stopped.
    pub(crate) fn is_cancelled(&self) -> bool {
        self.canceller.is_cancelled()
    }
}

/// Stops the renders of a [`Budget`]: a running render fails promptly with
/// [`ErrorKind::Cancelled`](crate::ErrorKind::Cancelled), and so does every
/// later render of that budget.
#[derive(Clone, Default)]
pub struct Canceller {
    flag: Arc<AtomicBool>,
}

impl Canceller {
    /// Stops the renders.
    pub fn cancel(&self) {
        self.flag.store(true, Ordering::Relaxed);
    }

    /// Whether [`cancel`](Self::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        self.flag.load(Ordering::Relaxed)
    }
}

impl fmt::Debug for Canceller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Canceller")
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}

thread_local! {
    /// The canceller of the render running on this thread.
    static CURRENT: RefCell<Option<Canceller>> = const { RefCell::new(None) };
}

/// Makes `canceller` the current render's while the guard lives.
pub(crate) struct Scope {
    previous: Option<Canceller>,
}

impl Scope {
    /// Enters the scope of a render.
    pub(crate) fn enter(canceller: &Canceller) -> Scope {
        let previous = CURRENT.with(|c| c.replace(Some(canceller.clone())));
        Scope { previous }
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        let previous = self.previous.take();
        CURRENT.with(|c| *c.borrow_mut() = previous);
    }
}

/// Whether the render running on this thread was stopped.
pub(crate) fn cancelled() -> bool {
    CURRENT.with(|c| c.borrow().as_ref().is_some_and(Canceller::is_cancelled))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowance_is_the_smaller_of_the_render_fuel_and_what_is_left() {
        let mut budget = Budget::new(1_000);
        assert_eq!(budget.allowance(300), 300);
        budget.spend(800);
        assert_eq!(budget.allowance(300), 200);
        assert_eq!((budget.used(), budget.remaining()), (800, 200));
        budget.spend(u64::MAX);
        assert_eq!((budget.used(), budget.remaining()), (1_000, 0));
    }

    #[test]
    fn the_scope_follows_the_canceller_of_the_render() {
        let outer = Canceller::default();
        assert!(!cancelled());
        let scope = Scope::enter(&outer);
        outer.cancel();
        assert!(cancelled());
        {
            let inner = Canceller::default();
            let _inner = Scope::enter(&inner);
            assert!(!cancelled());
        }
        assert!(cancelled());
        drop(scope);
        assert!(!cancelled());
    }

    #[test]
    fn budgets_move_between_threads() {
        fn assert_send<T: Send>() {}
        fn assert_shared<T: Clone + Send + Sync + fmt::Debug>() {}
        assert_send::<Budget>();
        assert_shared::<Canceller>();
    }
}
