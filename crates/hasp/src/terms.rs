//! What every handle that takes holds of its own chooses: the lease mode
//! of its holds and the owner it acts for.

/// The lease and owner methods of a handle with the fields
/// `core: Arc<Core>`, `lease: Lease` and `owner: Option<Owner>`, written
/// once for [`Lock`](crate::lock::Lock), [`RwLock`](crate::rw_lock::RwLock)
/// and [`Semaphore`](crate::semaphore::Semaphore).
macro_rules! hold_terms {
    () => {
        /// This handle with a fixed lease: what it takes expires after
        /// `lease` unless given back, and is never renewed (a re-entry
        /// re-arms the lease to this value).
        ///
        /// # Errors
        /// [`Error::InvalidArgument`](crate::error::Error::InvalidArgument)
        /// if `lease` is zero or above the client's `max_lease`.
        pub fn with_lease(mut self, lease: std::time::Duration) -> crate::error::Result<Self> {
            self.lease = crate::core::holds::Lease::Fixed(crate::config::validate_lease(
                self.core.settings(),
                lease,
            )?);
            Ok(self)
        }

        /// This handle in watchdog mode (the default): leases renewed by
        /// the client's watchdog for as long as the holds are kept.
        pub fn with_watchdog(mut self) -> Self {
            self.lease = crate::core::holds::Lease::Watchdog;
            self
        }

        /// This handle acting for `owner` instead of the current task.
        pub fn with_owner(mut self, owner: hasp_owner::Owner) -> Self {
            self.owner = Some(owner);
            self
        }

        /// The owner this handle acts for, resolved now (the current task
        /// unless an explicit owner was set).
        pub fn owner(&self) -> hasp_owner::Owner {
            match &self.owner {
                Some(owner) => owner.clone(),
                None => hasp_owner::Owner::current(self.core.id()),
            }
        }
    };
}
pub(crate) use hold_terms;
