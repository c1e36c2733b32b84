use std::time::Duration;

use hasp::{Client, Settings};
use testkit::{FaultProxy, RedisServer};

/// Several independent redis-servers.
pub struct Servers {
    pub servers: Vec<RedisServer>,
}

/// Settings for tests: answers within 500 ms, or an error.
pub fn quick() -> Settings {
    Settings::default()
        .set_response_timeout(Duration::from_millis(500))
        .set_connection_timeout(Duration::from_millis(500))
}

impl Servers {
    pub fn start(n: usize) -> Self {
        Self {
            servers: testkit::start_servers(n),
        }
    }

    /// One client per server.
    pub async fn clients(&self, settings: Settings) -> Vec<Client> {
        let mut clients = Vec::new();
        for server in &self.servers {
            clients.push(
                Client::open_with(&server.url(), settings.clone())
                    .await
                    .expect("open client"),
            );
        }
        clients
    }

    /// One client per server, each through its own fault proxy.
    pub async fn proxied_clients(&self, settings: Settings) -> (Vec<FaultProxy>, Vec<Client>) {
        let mut proxies = Vec::new();
        let mut clients = Vec::new();
        for server in &self.servers {
            let proxy = FaultProxy::start(server);
            clients.push(
                Client::open_with(&proxy.url(), settings.clone())
                    .await
                    .expect("open client"),
            );
            proxies.push(proxy);
        }
        (proxies, clients)
    }

    /// Whether the lock key of `name` exists on server `i`.
    pub fn exists(&self, i: usize, name: &str) -> bool {
        self.servers[i].cli(&["EXISTS", &lock_key(name)]).trim() == "1"
    }

    /// How many servers hold a key for `name`.
    pub fn holding(&self, name: &str) -> usize {
        (0..self.servers.len())
            .filter(|i| self.exists(*i, name))
            .count()
    }

    /// Whether `name` is gone from every server within `limit` (releases of
    /// abandoned tries complete in the background).
    pub async fn gone_everywhere(&self, name: &str, limit: Duration) -> bool {
        testkit::eventually(limit, || async { self.holding(name) == 0 }).await
    }
}

/// The lock hash key of `name` under the default prefix.
pub fn lock_key(name: &str) -> String {
    format!("hasp:{{{name}}}")
}

/// Calls of the batch function (`FCALL`) a server has run so far.
pub fn batch_calls(server: &RedisServer) -> u64 {
    let stats = server.cli(&["INFO", "commandstats"]);
    stats
        .lines()
        .find(|l| l.starts_with("cmdstat_fcall:"))
        .and_then(|l| l.split("calls=").nth(1))
        .and_then(|l| l.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

impl Servers {
    /// Whether `name` is gone from every server but `keep` within `limit`.
    pub async fn gone_everywhere_but(&self, keep: usize, name: &str, limit: Duration) -> bool {
        testkit::eventually(limit, || async {
            (0..self.servers.len()).all(|i| i == keep || !self.exists(i, name))
        })
        .await
    }
}

impl Servers {
    /// Whether, within `limit`, the only servers with a key for `name` are
    /// among `held` (the blockers').
    pub async fn gone_everywhere_but_held_by(
        &self,
        held: &[usize],
        name: &str,
        limit: Duration,
    ) -> bool {
        testkit::eventually(limit, || async {
            (0..self.servers.len()).all(|i| held.contains(&i) || !self.exists(i, name))
        })
        .await
    }
}
