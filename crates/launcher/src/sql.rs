//! Private PostgreSQL and MariaDB servers, on unix sockets in a temporary
//! directory, with no network listener unless they are asked to speak TLS
//! (then also on a free TCP port of 127.0.0.1, refusing any client there
//! that does not use TLS); stopped on drop. (MariaDB is for tests only: its
//! constructors panic on failure.)
//!
//! PostgreSQL refuses to run as root, so when the tests run as root the
//! server runs as the `postgres` user that Debian's package creates.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::LaunchError;

fn temp_dir(kind: &str) -> Result<PathBuf, LaunchError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "hasp-{kind}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| LaunchError::io("creating a server directory", e))?;
    Ok(dir)
}

fn missing(what: &str) -> LaunchError {
    LaunchError::Missing(format!(
        "{what} not found. Run `scripts/ensure-deps.sh` (installs it with apt-get)"
    ))
}

fn wait_for(path: &Path, child: &mut Child, what: &str, log: &Path) -> Result<(), LaunchError> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(LaunchError::Failed(format!(
                "{what} exited with {status}: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            )));
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(LaunchError::Failed(format!(
                "{what} did not start within 30 s"
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn stop(child: &mut Option<Child>) {
    if let Some(mut child) = child.take() {
        // A fast, clean shutdown (SIGINT for PostgreSQL, SIGTERM for MariaDB
        // both work); SIGKILL if it lingers.
        let _ = Command::new("kill")
            .arg("-INT")
            .arg(child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// The uid and gid of a system user.
fn user_ids(name: &str) -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.first() == Some(&name))
            .then(|| Some((fields.get(2)?.parse().ok()?, fields.get(3)?.parse().ok()?)))
            .flatten()
    })
}

/// A private PostgreSQL server with a `test` database.
#[derive(Debug)]
pub struct PostgresServer {
    child: Option<Child>,
    dir: PathBuf,
    bin: PathBuf,
    /// The port (of the socket's name; of 127.0.0.1 as well with TLS).
    port: u16,
    /// With TLS: the CA file clients are to trust.
    tls_ca: Option<PathBuf>,
}

/// PostgreSQL's default port, which names its unix socket when it has no
/// TCP listener.
const POSTGRES_PORT: u16 = 5432;

impl PostgresServer {
    /// Initialises a cluster in a temporary directory and starts it.
    ///
    /// # Panics
    /// As [`PostgresServer::try_start`] fails (for tests).
    pub fn start() -> Self {
        Self::try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Initialises a cluster in a temporary directory (`fsync` off: the
    /// server survives its own crash, not the machine's) and starts it.
    ///
    /// # Errors
    /// [`LaunchError`] if PostgreSQL is not installed or does not start.
    pub fn try_start() -> Result<Self, LaunchError> {
        Self::try_start_inner(None)
    }

    /// As [`PostgresServer::try_start`], also listening on a free port of
    /// 127.0.0.1 with TLS (`ca`'s server certificate, for 127.0.0.1 and
    /// localhost) and refusing any connection there that does not use it
    /// (`hostnossl … reject`); see [`PostgresServer::tls_url`].
    ///
    /// # Errors
    /// As [`PostgresServer::try_start`].
    pub fn try_start_with_tls(ca: &crate::tls::TestCa) -> Result<Self, LaunchError> {
        Self::try_start_inner(Some(ca))
    }

    fn try_start_inner(ca: Option<&crate::tls::TestCa>) -> Result<Self, LaunchError> {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .ok()
            .and_then(|versions| {
                versions
                    .filter_map(Result::ok)
                    .map(|v| v.path().join("bin"))
                    .filter(|b| b.join("initdb").exists())
                    .max()
            })
            .ok_or_else(|| missing("PostgreSQL (initdb)"))?;
        let dir = temp_dir("postgres")?;
        if running_as_root() {
            let status = Command::new("chown")
                .arg("-R")
                .arg("postgres:")
                .arg(&dir)
                .status()
                .map_err(|e| LaunchError::io("running chown", e))?;
            if !status.success() {
                return Err(LaunchError::Failed(
                    "chown of the PostgreSQL directory failed".into(),
                ));
            }
        }
        let mut init = Command::new(bin.join("initdb"));
        init.arg("-D")
            .arg(dir.join("data"))
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        as_postgres(&mut init)?;
        let initialised = init
            .status()
            .map_err(|e| LaunchError::io("running initdb", e))?;
        if !initialised.success() {
            return Err(LaunchError::Failed("initdb failed".into()));
        }
        let port = match ca {
            Some(ca) => {
                postgres_tls_files(&dir, ca)?;
                crate::redis::free_tcp_port()
            }
            None => POSTGRES_PORT,
        };
        let mut this = Self {
            child: None,
            dir,
            bin,
            port,
            tls_ca: ca.map(crate::tls::TestCa::ca_file),
        };
        this.spawn()?;
        this.wait_ready("CREATE DATABASE test")?;
        Ok(this)
    }

    fn spawn(&mut self) -> Result<(), LaunchError> {
        let log = self.dir.join("postgres.log");
        let mut server = Command::new(self.bin.join("postgres"));
        server
            .arg("-D")
            .arg(self.dir.join("data"))
            .arg("-k")
            .arg(&self.dir)
            .args(["-p", &self.port.to_string()])
            .args(["-c", "fsync=off", "-c", "full_page_writes=off"]);
        if self.tls_ca.is_some() {
            server.args(["-c", "listen_addresses=127.0.0.1", "-c", "ssl=on"]);
            server
                .arg("-c")
                .arg(format!(
                    "ssl_cert_file={}",
                    self.dir.join("server.crt").display()
                ))
                .arg("-c")
                .arg(format!(
                    "ssl_key_file={}",
                    self.dir.join("server.key").display()
                ));
        } else {
            server.args(["-c", "listen_addresses="]);
        }
        server.stdin(Stdio::null()).stdout(Stdio::null()).stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .map_err(|e| LaunchError::io("opening postgres.log", e))?,
        );
        as_postgres(&mut server)?;
        let mut child = server
            .spawn()
            .map_err(|e| LaunchError::io("starting postgres", e))?;
        let ready = wait_for(&self.socket(), &mut child, "postgres", &log);
        self.child = Some(child);
        ready
    }

    /// Runs `sql` until it succeeds (the socket appears a moment before
    /// connections are accepted), for up to 30 s.
    fn wait_ready(&self, sql: &str) -> Result<(), LaunchError> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.psql(sql) {
            if Instant::now() >= deadline {
                return Err(LaunchError::Failed(
                    "postgres never accepted connections".into(),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    fn socket(&self) -> PathBuf {
        self.dir.join(format!(".s.PGSQL.{}", self.port))
    }

    fn psql(&self, sql: &str) -> bool {
        Command::new("psql")
            .arg("-h")
            .arg(&self.dir)
            .args(["-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", "postgres", "-q", "-c", sql])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Stops the server: `SIGKILL` when `crash`, else a fast shutdown. Its
    /// data stays for [`PostgresServer::try_restart`].
    pub fn stop(&mut self, crash: bool) {
        match (crash, self.child.as_mut()) {
            (true, Some(child)) => {
                let _ = child.kill();
                let _ = child.wait();
                self.child = None;
            }
            _ => stop(&mut self.child),
        }
        // A killed postmaster leaves its socket and lock file behind.
        let _ = std::fs::remove_file(self.socket());
    }

    /// Starts the server again on its data after [`PostgresServer::stop`]
    /// (stopping it first if it runs); returns once it accepts connections.
    ///
    /// # Errors
    /// [`LaunchError`] if it does not start.
    pub fn try_restart(&mut self) -> Result<(), LaunchError> {
        if self.child.is_some() {
            self.stop(false);
        }
        self.spawn()?;
        self.wait_ready("SELECT 1")
    }

    /// URL of the `test` database (sqlx form, unix socket).
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@localhost:{}/test?host={}",
            self.port,
            self.dir.display()
        )
    }

    /// URL of the `test` database over TLS, verifying the server's
    /// certificate against the CA and its name (`sslmode=verify-full`);
    /// `None` unless started with [`PostgresServer::try_start_with_tls`].
    pub fn tls_url(&self) -> Option<String> {
        let ca = self.tls_ca.as_ref()?;
        Some(format!(
            "postgres://postgres@127.0.0.1:{}/test?sslmode=verify-full&sslrootcert={}",
            self.port,
            ca.display()
        ))
    }

    /// URL of the `test` database over TCP without TLS (which a server
    /// started with TLS refuses); `None` without a TCP listener.
    pub fn plain_tcp_url(&self) -> Option<String> {
        self.tls_ca.as_ref()?;
        Some(format!(
            "postgres://postgres@127.0.0.1:{}/test?sslmode=disable",
            self.port
        ))
    }
}

/// The server's certificate and key in its directory (PostgreSQL refuses a
/// key others can read, and runs as `postgres` under root), and a
/// `pg_hba.conf` that trusts the unix socket and TLS on 127.0.0.1 and
/// rejects TCP without it.
fn postgres_tls_files(dir: &Path, ca: &crate::tls::TestCa) -> Result<(), LaunchError> {
    use std::os::unix::fs::PermissionsExt;
    let copy = |from: PathBuf, to: &str, mode: u32| -> Result<(), LaunchError> {
        let to = dir.join(to);
        std::fs::copy(from, &to).map_err(|e| LaunchError::io("copying a certificate", e))?;
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode))
            .map_err(|e| LaunchError::io("setting a key's permissions", e))?;
        if running_as_root() {
            let (uid, gid) = user_ids("postgres").ok_or_else(|| missing("the postgres user"))?;
            std::os::unix::fs::chown(&to, Some(uid), Some(gid))
                .map_err(|e| LaunchError::io("handing a certificate to postgres", e))?;
        }
        Ok(())
    };
    copy(ca.server_cert_file(), "server.crt", 0o644)?;
    copy(ca.server_key_file(), "server.key", 0o600)?;
    std::fs::write(
        dir.join("data/pg_hba.conf"),
        "local all all trust\n\
         hostssl all all 127.0.0.1/32 trust\n\
         hostnossl all all 127.0.0.1/32 reject\n",
    )
    .map_err(|e| LaunchError::io("writing pg_hba.conf", e))
}

/// Runs `cmd` as the `postgres` user when this process is root (PostgreSQL
/// refuses to run as root).
fn as_postgres(cmd: &mut Command) -> Result<(), LaunchError> {
    if running_as_root() {
        let (uid, gid) = user_ids("postgres").ok_or_else(|| missing("the postgres user"))?;
        cmd.uid(uid).gid(gid);
    }
    Ok(())
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        stop(&mut self.child);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A private MariaDB server with a `test` database.
#[derive(Debug)]
pub struct MariaDbServer {
    child: Option<Child>,
    dir: PathBuf,
    /// With TLS: its port on 127.0.0.1 and the CA file clients are to trust.
    tls: Option<(u16, PathBuf)>,
}

impl MariaDbServer {
    /// Installs system tables in a temporary directory and starts the server.
    ///
    /// # Panics
    /// If MariaDB is not installed or does not start.
    pub fn start() -> Self {
        Self::start_inner(None)
    }

    /// As [`MariaDbServer::start`], also listening on a free port of
    /// 127.0.0.1 with TLS (`ca`'s server certificate) and requiring it of
    /// every TCP client (`require_secure_transport`); a user `shop`
    /// (password `shop`) may connect there. See [`MariaDbServer::tls_url`].
    ///
    /// # Panics
    /// As [`MariaDbServer::start`].
    pub fn start_with_tls(ca: &crate::tls::TestCa) -> Self {
        Self::start_inner(Some(ca))
    }

    fn start_inner(ca: Option<&crate::tls::TestCa>) -> Self {
        let dir = temp_dir("mariadb").unwrap_or_else(|e| panic!("{e}"));
        let data = dir.join("data");
        let log = dir.join("mariadb.log");
        // A private temporary directory: installs running at once in the
        // shared /tmp clash on their temporary tables' names (seen: 4 of 16
        // parallel installs failed with "Unknown table mysql.tmp_user_sys").
        let tmp = dir.join("tmp");
        std::fs::create_dir_all(&tmp).expect("create MariaDB tmpdir");
        let install_log = dir.join("install.log");
        let installed = Command::new("mariadb-install-db")
            // Ignore the machine's my.cnf: it may force a user or paths.
            .arg("--no-defaults")
            .arg(format!("--user={}", current_user()))
            .arg(format!("--datadir={}", data.display()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
            .env("TMPDIR", &tmp)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&install_log).expect("create install log"))
            .status();
        match installed {
            Ok(s) if s.success() => {}
            Ok(s) => panic!(
                "mariadb-install-db failed ({s}):\n{}",
                std::fs::read_to_string(&install_log).unwrap_or_default()
            ),
            Err(_) => panic!("{}", missing("MariaDB (mariadb-install-db)")),
        }
        let socket = dir.join("mysqld.sock");
        let tls = ca.map(|ca| (crate::redis::free_tcp_port(), ca.ca_file()));
        let mut server = Command::new("mariadbd");
        server
            .arg("--no-defaults")
            .arg(format!("--user={}", current_user()))
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--pid-file={}", dir.join("mariadb.pid").display()))
            .arg(format!("--log-error={}", log.display()))
            .arg(format!("--tmpdir={}", tmp.display()))
            .arg("--innodb-flush-log-at-trx-commit=0");
        match (ca, &tls) {
            (Some(ca), Some((port, _))) => {
                server
                    .arg(format!("--port={port}"))
                    .arg("--bind-address=127.0.0.1")
                    .arg(format!("--ssl-cert={}", ca.server_cert_file().display()))
                    .arg(format!("--ssl-key={}", ca.server_key_file().display()))
                    .arg(format!("--ssl-ca={}", ca.ca_file().display()))
                    .arg("--require-secure-transport=ON");
            }
            _ => {
                server.arg("--skip-networking");
            }
        }
        let mut child = server
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|_| panic!("{}", missing("MariaDB (mariadbd)")));
        wait_for(&socket, &mut child, "mariadbd", &log).unwrap_or_else(|e| panic!("{e}"));
        let this = Self {
            child: Some(child),
            dir,
            tls,
        };
        let mut sql = String::from("CREATE DATABASE test;");
        if this.tls.is_some() {
            sql.push_str(
                "CREATE USER 'shop'@'%' IDENTIFIED BY 'shop'; \
                 GRANT ALL ON test.* TO 'shop'@'%';",
            );
        }
        let created = Command::new("mariadb")
            .arg("--no-defaults")
            .arg("-S")
            .arg(&socket)
            .args(["-u", "root", "-e", &sql])
            .status()
            .is_ok_and(|s| s.success());
        assert!(created, "could not create the test database");
        this
    }

    /// URL of the `test` database over TLS as `shop`, verifying the
    /// server's certificate against the CA and its name
    /// (`ssl-mode=VERIFY_IDENTITY`); `None` unless started with
    /// [`MariaDbServer::start_with_tls`].
    pub fn tls_url(&self) -> Option<String> {
        let (port, ca) = self.tls.as_ref()?;
        Some(format!(
            "mysql://shop:shop@127.0.0.1:{port}/test?ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
            ca.display()
        ))
    }

    /// URL of the `test` database over TCP without TLS (which the server
    /// refuses); `None` without a TCP listener.
    pub fn plain_tcp_url(&self) -> Option<String> {
        let (port, _) = self.tls.as_ref()?;
        Some(format!(
            "mysql://shop:shop@127.0.0.1:{port}/test?ssl-mode=DISABLED"
        ))
    }

    /// URL of the `test` database (sqlx form, unix socket).
    pub fn url(&self) -> String {
        format!(
            "mysql://root@localhost/test?socket={}",
            self.dir.join("mysqld.sock").display()
        )
    }
}

impl Drop for MariaDbServer {
    fn drop(&mut self) {
        stop(&mut self.child);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn current_user() -> String {
    std::env::var("USER").unwrap_or_else(|_| {
        if running_as_root() {
            "root".into()
        } else {
            "nobody".into()
        }
    })
}

/// Whether this process runs as root (read from /proc: no libc binding needed).
fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|uid| uid == "0"))
        })
        .unwrap_or(false)
}
