//! How much of the KMS's answers a replica holds at once.
//!
//! A KMS answer is read whole (at most 32 MiB), parsed, and the secrets it
//! carries are kept while the resources that asked for them render and
//! write their targets. Many workers reading large answers at once could
//! hold many times the pod's memory, so every answer first reserves its
//! size (twice its body: the body and what it parses into) from one budget
//! per replica (`--kms-memory-budget`), and gives it back when the last
//! holder of its secrets lets go. Requests wait for the budget; one answer
//! never needs more than the whole budget.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// What an answer reserves per byte of its body (the body, then the
/// secrets parsed from it).
const PER_BODY_BYTE: u64 = 2;

/// The budget, in KiB.
#[derive(Clone, Debug)]
pub struct AnswerBudget {
    kib: Arc<Semaphore>,
    total_kib: u32,
}

/// A reservation; dropping it gives the bytes back.
#[derive(Debug)]
pub struct Held(OwnedSemaphorePermit);

impl Held {
    /// KiB reserved.
    pub fn kib(&self) -> usize {
        self.0.num_permits()
    }

    /// Keep only what `body_bytes` of body needs, giving the rest back (a
    /// body of unknown length reserved the most a body may be).
    pub fn shrink_to(&mut self, body_bytes: usize, total_kib: u32) {
        let need = kib_for(body_bytes as u64, total_kib) as usize;
        if let Some(excess) = self.kib().checked_sub(need).filter(|e| *e > 0) {
            drop(self.0.split(excess));
        }
    }
}

/// KiB a body of `bytes` reserves: at least 1, at most the whole budget.
fn kib_for(bytes: u64, total_kib: u32) -> u32 {
    let kib = bytes.saturating_mul(PER_BODY_BYTE).div_ceil(1024);
    u32::try_from(kib).unwrap_or(u32::MAX).clamp(1, total_kib)
}

impl AnswerBudget {
    /// A budget of `bytes` (at least 1 KiB).
    pub fn new(bytes: u64) -> Self {
        let total_kib = u32::try_from(bytes / 1024).unwrap_or(u32::MAX).max(1);
        Self {
            kib: Arc::new(Semaphore::new(total_kib as usize)),
            total_kib,
        }
    }

    /// The budget in KiB.
    pub fn total_kib(&self) -> u32 {
        self.total_kib
    }

    /// KiB free now.
    pub fn available_kib(&self) -> usize {
        self.kib.available_permits()
    }

    /// Reserve what a body of `bytes` needs, without waiting.
    pub fn try_hold(&self, bytes: u64) -> Option<Held> {
        self.kib
            .clone()
            .try_acquire_many_owned(kib_for(bytes, self.total_kib))
            .ok()
            .map(Held)
    }

    /// Reserve what a body of `bytes` needs, waiting for it.
    pub async fn hold(&self, bytes: u64) -> Held {
        let permit = self
            .kib
            .clone()
            .acquire_many_owned(kib_for(bytes, self.total_kib))
            .await
            .expect("the budget's semaphore is never closed");
        Held(permit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn answers_wait_for_the_budget_and_give_it_back() {
        let budget = AnswerBudget::new(4 << 20);
        assert_eq!(budget.total_kib(), 4096);
        // 1 MiB of body reserves 2 MiB.
        let a = budget.hold(1 << 20).await;
        assert_eq!(a.kib(), 2048);
        let b = budget.try_hold(1 << 20).expect("room for a second");
        assert!(budget.try_hold(1).is_none(), "the budget is spent");
        drop(a);
        assert!(budget.try_hold(1 << 20).is_some());
        drop(b);
        // One answer never needs more than the whole budget.
        let big = budget.hold(1 << 30).await;
        assert_eq!(big.kib(), 4096);
        drop(big);
        assert_eq!(budget.available_kib(), 4096);
    }

    #[tokio::test]
    async fn a_reservation_shrinks_to_its_body() {
        let budget = AnswerBudget::new(64 << 20);
        let mut held = budget.hold(32 << 20).await;
        assert_eq!(held.kib(), 64 << 10);
        held.shrink_to(10 * 1024, budget.total_kib());
        assert_eq!(held.kib(), 20);
        assert_eq!(budget.available_kib(), (64 << 10) - 20);
    }
}
