//! Whether a Redis server's sale state has been verified against the
//! database for the data it holds now.
//!
//! Purchases run only on a server that has the purchase script loaded
//! ([`FastPath`](super::FastPath) sends it by hash, never loading it
//! implicitly), and the script is loaded only after a verification. A
//! restart forgets the script, which covers a server that lost or rolled
//! back its data. A server's data also changes hands without a restart: a
//! replica promoted holds what it had replicated, and a former master that
//! rejoined as a replica and is promoted again (a failback) holds what it
//! copied from the master it followed, while keeping the script it had
//! before. So the verification also records the server's replication
//! history (`INFO replication`'s `master_replid`, new each time a server
//! becomes master) under `<prefix>:verified-history`, and a server whose
//! history differs from the one recorded has its scripts flushed
//! ([`disarm_unless_verified`]) before purchases go to it: they answer
//! `NOSCRIPT`, and the service verifies the sale state first (`repair`).
//!
//! A server that a Sentinel connection leaves for another master is fenced
//! the same way ([`fence`]): it stays master until the sentinels demote it,
//! and a purchase still sent there would be lost with its data.

use std::time::Duration;

use redis::aio::ConnectionLike;

/// How long a fence or a check may take on a server that may be gone.
const CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// A server's place in replication, from `INFO replication`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct History {
    /// Whether it is a master (takes writes).
    pub master: bool,
    /// Its `master_replid`: the history of its data, new each time it
    /// becomes master.
    pub id: String,
}

/// The server's replication history.
pub(crate) async fn history(conn: &mut impl ConnectionLike) -> redis::RedisResult<History> {
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query_async(conn)
        .await?;
    parse_history(&info)
}

/// The replication history in `INFO replication`'s answer `info`.
pub(crate) fn parse_history(info: &str) -> redis::RedisResult<History> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let id = field("master_replid").ok_or_else(|| {
        redis::RedisError::from((
            redis::ErrorKind::Parse,
            "INFO replication without master_replid",
        ))
    })?;
    Ok(History {
        master: field("role") == Some("master"),
        id: id.to_owned(),
    })
}

/// Flushes the scripts of the master behind `conn` unless its sale state
/// was verified for its current replication history (see the module
/// docs); returns whether it did. A replica is left alone: it takes no
/// purchase.
pub(crate) async fn disarm_unless_verified(
    conn: &mut impl ConnectionLike,
    mark: &str,
) -> redis::RedisResult<bool> {
    let now = history(conn).await?;
    if !now.master {
        return Ok(false);
    }
    let verified: Option<String> = redis::cmd("GET").arg(mark).query_async(conn).await?;
    if verified.as_deref() == Some(now.id.as_str()) {
        return Ok(false);
    }
    let () = redis::cmd("SCRIPT").arg("FLUSH").query_async(conn).await?;
    tracing::warn!(
        history = %now.id,
        "this Redis master's data was not verified against the database: purchases wait for a repair"
    );
    Ok(true)
}

/// Stops purchases on a master being left for another: its scripts are
/// flushed, so a purchase still sent there is refused (`NOSCRIPT`, nothing
/// bought) instead of made on a server whose data is about to be replaced.
/// A server that cannot be reached within a second is skipped (it takes
/// nothing either).
pub(crate) async fn fence(conn: &mut impl ConnectionLike) {
    let flushed = tokio::time::timeout(
        CHECK_TIMEOUT,
        redis::cmd("SCRIPT").arg("FLUSH").query_async::<()>(conn),
    )
    .await;
    match flushed {
        Ok(Ok(())) => tracing::info!("purchases stopped on the Redis master left behind"),
        Ok(Err(e)) => tracing::info!(error = %e, "the Redis master left behind did not answer"),
        Err(_) => tracing::info!("the Redis master left behind did not answer within 1 s"),
    }
}

/// Records that the sale state on the server behind `conn` was verified
/// for `verified` (read before the verification started).
///
/// # Errors
/// A [`redis::RedisError`] if Redis fails, or if the server's history is
/// no longer `verified` or it is no longer master (then the verification
/// is worth nothing there: the next purchase asks for another).
pub(crate) async fn record(
    conn: &mut impl ConnectionLike,
    mark: &str,
    verified: &History,
) -> redis::RedisResult<()> {
    let now = history(conn).await?;
    if now != *verified || !now.master {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
            "the Redis master changed during the sale state's verification",
        )));
    }
    redis::cmd("SET")
        .arg(mark)
        .arg(&now.id)
        .query_async(conn)
        .await
}

/// The check of a newly resolved Sentinel master, for
/// [`MasterConnection::on_switch`](hasp::sentinel::MasterConnection::on_switch): fence the
/// master left behind, then hold purchases on the new one unless it is
/// verified.
pub(crate) fn on_switch(mark: String) -> hasp::sentinel::OnSwitch {
    std::sync::Arc::new(move |left, mut next| {
        let mark = mark.clone();
        Box::pin(async move {
            if let Some(mut left) = left {
                fence(&mut left).await;
            }
            tokio::time::timeout(CHECK_TIMEOUT, disarm_unless_verified(&mut next, &mark))
                .await
                .map_err(|_| {
                    redis::RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the new Redis master did not answer its check within 1 s",
                    ))
                })?
                .map(drop)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn exists(conn: &mut impl ConnectionLike, sha: &str) -> bool {
        let e: Vec<bool> = redis::cmd("SCRIPT")
            .arg("EXISTS")
            .arg(sha)
            .query_async(conn)
            .await
            .unwrap();
        e[0]
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_master_whose_history_is_not_the_verified_one_is_disarmed() {
        let server = testkit::RedisServer::start();
        let client = redis::Client::open(server.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let load = || redis::cmd("SCRIPT").arg("LOAD").arg("return 1").to_owned();
        let sha: String = load().query_async(&mut conn).await.unwrap();
        // Nothing recorded: disarmed.
        assert!(disarm_unless_verified(&mut conn, "p:verified-history")
            .await
            .unwrap());
        assert!(!exists(&mut conn, &sha).await);
        // Recorded for this history: left armed.
        let now = history(&mut conn).await.unwrap();
        assert!(now.master);
        record(&mut conn, "p:verified-history", &now).await.unwrap();
        let _: String = load().query_async(&mut conn).await.unwrap();
        assert!(!disarm_unless_verified(&mut conn, "p:verified-history")
            .await
            .unwrap());
        assert!(exists(&mut conn, &sha).await);
        // A new history (the server became a replica, then master again):
        // disarmed, and a verification recorded for the old one is refused.
        let other = testkit::RedisServer::start_tcp();
        let port = other.port().expect("tcp");
        let _: () = redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(port)
            .query_async(&mut conn)
            .await
            .unwrap();
        let _: () = redis::cmd("REPLICAOF")
            .arg("NO")
            .arg("ONE")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_ne!(history(&mut conn).await.unwrap().id, now.id);
        assert!(record(&mut conn, "p:verified-history", &now).await.is_err());
        let _: String = load().query_async(&mut conn).await.unwrap();
        assert!(disarm_unless_verified(&mut conn, "p:verified-history")
            .await
            .unwrap());
        assert!(!exists(&mut conn, &sha).await);
    }
}
