//! Re-entry of a lock made of several parts, counted client-side.
//!
//! The owner that holds a MultiLock or RedLock takes it again without a
//! Redis call: the handle (and its clones) keeps one entry per owner set —
//! the owners its parts act for — with a count of the guards handed out.
//! The parts are released when the count returns to zero.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use hasp_owner::Owner;

/// What a hold of several parts tells the registry.
pub(crate) trait Held {
    /// True once the hold is known to be lost: a re-entry must not extend
    /// it.
    fn is_lost(&self) -> bool;
}

/// What a release must do next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Other guards of the hold remain.
    Local,
    /// The last guard: release the parts.
    Final,
    /// The hold is not (or no longer) registered.
    NotHeld,
}

#[derive(Debug)]
struct Entry<H> {
    count: u32,
    hold: Arc<H>,
}

/// The holds of one handle and its clones, by owner set.
#[derive(Debug)]
pub(crate) struct Holders<H> {
    map: Mutex<HashMap<Vec<Owner>, Entry<H>>>,
}

impl<H> Default for Holders<H> {
    fn default() -> Self {
        Self {
            map: Mutex::default(),
        }
    }
}

impl<H: Held> Holders<H> {
    fn map(&self) -> MutexGuard<'_, HashMap<Vec<Owner>, Entry<H>>> {
        // Every update is one insert, remove or increment: poison is moot.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One more guard of the live hold of `owners`, if there is one. A lost
    /// hold stays registered until its guards are released (its parts
    /// must still be freed), but is not re-entered: the caller acquires
    /// afresh, which waits for it like for any other holder.
    pub(crate) fn reenter(&self, owners: &[Owner]) -> Option<Arc<H>> {
        let mut map = self.map();
        let entry = map.get_mut(owners)?;
        if entry.hold.is_lost() {
            return None;
        }
        entry.count += 1;
        Some(entry.hold.clone())
    }

    /// Registers a hold just acquired. A lost hold of the same owners that
    /// is still registered is replaced; its guards find it gone.
    pub(crate) fn insert(&self, owners: Vec<Owner>, hold: Arc<H>) {
        self.map().insert(owners, Entry { count: 1, hold });
    }

    /// Gives back one guard of `hold`.
    pub(crate) fn release(&self, owners: &[Owner], hold: &Arc<H>) -> Step {
        let mut map = self.map();
        let Some(entry) = map.get_mut(owners) else {
            return Step::NotHeld;
        };
        if !Arc::ptr_eq(&entry.hold, hold) {
            return Step::NotHeld;
        }
        if entry.count > 1 {
            entry.count -= 1;
            return Step::Local;
        }
        map.remove(owners);
        Step::Final
    }

    /// Guards handed out for the live hold of `owners` (0 if none or lost).
    pub(crate) fn count(&self, owners: &[Owner]) -> u32 {
        match self.map().get(owners) {
            Some(entry) if !entry.hold.is_lost() => entry.count,
            _ => 0,
        }
    }
}
