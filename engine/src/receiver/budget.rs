//! The receiver's buffer memory across sessions (`--max-memory`).
//!
//! Each session's buffer pool reserves its bytes here before it is
//! allocated, and a pool kept for the next session keeps its reservation,
//! so what the receiver holds in buffers never exceeds the budget however
//! many sessions are open.
#![forbid(unsafe_code)]

use std::sync::{Arc, Mutex};

/// Bytes of buffer memory the receiver may hold.
#[derive(Debug)]
pub(crate) struct Budget {
    max: u64,
    used: Mutex<u64>,
}

/// Bytes taken from a budget, given back on drop.
#[derive(Debug)]
pub(crate) struct Reservation {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Budget {
    pub(crate) fn new(max: u64) -> Self {
        Self {
            max,
            used: Mutex::new(0),
        }
    }

    fn used(&self) -> std::sync::MutexGuard<'_, u64> {
        self.used.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes `bytes`, or says how many are in use when they do not fit.
    pub(crate) fn reserve(self: &Arc<Self>, bytes: u64) -> Result<Reservation, u64> {
        let mut used = self.used();
        if used.saturating_add(bytes) > self.max {
            return Err(*used);
        }
        *used += bytes;
        Ok(Reservation {
            budget: Arc::clone(self),
            bytes,
        })
    }

    /// The cap.
    pub(crate) fn max(&self) -> u64 {
        self.max
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        *self.budget.used() -= self.bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_never_exceed_the_budget_and_come_back_on_drop() {
        let b = Arc::new(Budget::new(100));
        let r1 = b.reserve(60).unwrap();
        assert_eq!(b.reserve(50).unwrap_err(), 60, "says what is in use");
        let r2 = b.reserve(40).unwrap();
        drop(r1);
        let _r3 = b.reserve(60).expect("freed by the drop");
        drop(r2);
        assert_eq!(*b.used(), 60);
    }
}
