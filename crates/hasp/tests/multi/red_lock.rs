//! RedLock (multi 10-16).
