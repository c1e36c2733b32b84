//! The service's connection to the master of a Sentinel service.
//!
//! `redis+sentinel://host:port,host:port/<service>` names the sentinels
//! (any of them; each is asked in turn) and the service they watch. The
//! connection is hasp's [`MasterConnection`]: it asks the sentinels for the
//! master when it first connects and again whenever the master may have
//! changed. A command that failed because the master moved is not sent
//! again (a purchase sent twice could buy twice): it fails, the service
//! answers 503, and the next command goes to the master the sentinels name
//! then.

use std::time::Duration;

use hasp::sentinel::{MasterConnection, Sentinels};

use crate::error::{Error, Result};

/// The scheme of a Sentinel service's address.
pub const SENTINEL_SCHEME: &str = "redis+sentinel://";

/// The scheme of a Sentinel service's address over TLS (to the sentinels
/// and to the master they name).
pub const SENTINEL_TLS_SCHEME: &str = "rediss+sentinel://";

/// The sentinels' URLs and the service name of a `redis+sentinel://` URL,
/// or `None` for another one.
///
/// # Errors
/// [`Error::Invalid`] for a Sentinel URL without sentinels or service.
pub fn sentinel_service(redis_url: &str) -> Result<Option<(Vec<String>, String)>> {
    let (rest, scheme) = match redis_url.strip_prefix(SENTINEL_SCHEME) {
        Some(rest) => (rest, "redis"),
        None => match redis_url.strip_prefix(SENTINEL_TLS_SCHEME) {
            Some(rest) => (rest, "rediss"),
            None => return Ok(None),
        },
    };
    let invalid = |reason: &str| Error::Invalid {
        field: "redis_url",
        reason: format!("{redis_url:?}: {reason} (redis+sentinel://host:port,host:port/service)"),
    };
    let (hosts, service) = rest.split_once('/').ok_or_else(|| invalid("no service"))?;
    let service = service.trim_end_matches('/');
    if service.is_empty() || service.contains('/') {
        return Err(invalid("no service"));
    }
    let sentinels: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| format!("{scheme}://{h}/"))
        .collect();
    if sentinels.is_empty() {
        return Err(invalid("no sentinel"));
    }
    Ok(Some((sentinels, service.to_owned())))
}

/// Connects to the master the sentinels at `sentinels` name for `service`,
/// and follows it; each connection waits up to `connection_timeout` to
/// connect (each question to the sentinels too) and `response_timeout` for
/// an answer.
///
/// # Errors
/// [`Error::Redis`](crate::Error::Redis) if no sentinel names a master or
/// it cannot be reached; [`Error::Invalid`] for a bad URL or TLS setting.
pub async fn connect(
    sentinels: &[String],
    service: &str,
    tls: &super::tls::RedisTls,
    connection_timeout: Duration,
    response_timeout: Duration,
) -> Result<MasterConnection> {
    let tls = tls.hasp()?;
    let urls: Vec<&str> = sentinels.iter().map(String::as_str).collect();
    let sentinels = Sentinels::new(&urls, service, Some(&tls))
        .map_err(Error::from_connection)?
        .with_timeout(connection_timeout);
    MasterConnection::connect(sentinels, connection_timeout, response_timeout)
        .await
        .map_err(Error::from_connection)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_urls_name_sentinels_and_a_service() {
        let (sentinels, service) =
            sentinel_service("redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/shop")
                .unwrap()
                .unwrap();
        assert_eq!(
            sentinels,
            ["redis://127.0.0.1:26379/", "redis://127.0.0.1:26380/"]
        );
        assert_eq!(service, "shop");
        assert!(sentinel_service("redis://127.0.0.1/").unwrap().is_none());
        for bad in [
            "redis+sentinel://127.0.0.1:26379",
            "redis+sentinel://127.0.0.1:26379/",
            "redis+sentinel:///shop",
            "redis+sentinel://a:1/b/c",
        ] {
            assert!(sentinel_service(bad).is_err(), "{bad}");
        }
    }
}
