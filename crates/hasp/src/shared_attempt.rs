//! One attempt at a time at something that, when it fails, may fail
//! slowly: connecting to a server, asking the sentinels where the master
//! is. To a server that never answers each attempt waits out a timeout, so
//! tasks that queued behind a failed attempt fail with its error rather
//! than each trying again, one timeout after the other.

use std::future::Future;

use redis::{RedisError, RedisResult};
use tokio::sync::Mutex;
use tokio::time::Instant;

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct SharedAttempt {
    /// Held while an attempt runs; when the last attempt failed, and why.
    failed: Mutex<Option<(Instant, RedisError)>>,
}

impl SharedAttempt {
    /// What `made` finds (made by an attempt this task waited for), or the
    /// error of an attempt that ended while this task waited, or else the
    /// outcome of `attempt`, run now.
    ///
    /// # Cancel safety
    /// Cancel safe if `attempt` is: dropped while waiting, it attempts
    /// nothing; dropped while attempting, the attempt stops unrecorded.
    pub(crate) async fn run<T>(
        &self,
        made: impl Fn() -> Option<T>,
        attempt: impl Future<Output = RedisResult<T>>,
    ) -> RedisResult<T> {
        let asked = Instant::now();
        let mut failed = self.failed.lock().await;
        if let Some(made) = made() {
            return Ok(made);
        }
        if let Some((at, error)) = &*failed {
            if *at >= asked {
                return Err(error.clone());
            }
        }
        let outcome = attempt.await;
        *failed = outcome
            .as_ref()
            .err()
            .map(|error| (Instant::now(), error.clone()));
        outcome
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    use std::time::Duration;

    use redis::ErrorKind;

    use super::*;

    /// Sixteen tasks behind one failing attempt share its error; a task
    /// that asks after it ended attempts again; once one succeeds, what it
    /// made is found without another attempt.
    #[tokio::test]
    async fn tasks_behind_a_failed_attempt_share_its_error() {
        let shared = SharedAttempt::default();
        let attempts = AtomicUsize::new(0);
        let made: Mutex<Option<u32>> = Mutex::new(None);
        let found = || *made.lock().unwrap();
        let failing = || async {
            attempts.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
            Err::<u32, _>(RedisError::from((ErrorKind::Io, "no answer")))
        };
        let tasks = (0..16).map(|_| shared.run(found, failing()));
        for outcome in futures_util::future::join_all(tasks).await {
            assert!(outcome.is_err());
        }
        assert_eq!(attempts.load(Ordering::SeqCst), 1);

        assert!(shared.run(found, failing()).await.is_err());
        assert_eq!(attempts.load(Ordering::SeqCst), 2);

        let succeeding = || async {
            attempts.fetch_add(1, Ordering::SeqCst);
            *made.lock().unwrap() = Some(7);
            Ok(7)
        };
        assert_eq!(shared.run(found, succeeding()).await.unwrap(), 7);
        assert_eq!(shared.run(found, succeeding()).await.unwrap(), 7);
        assert_eq!(attempts.load(Ordering::SeqCst), 3);
    }
}
