//! Private PostgreSQL and MariaDB servers, on unix sockets in a temporary
//! directory, with no network listener; stopped on drop. (MariaDB is for
//! tests only: its constructor panics on failure.)
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
}

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
        let mut this = Self {
            child: None,
            dir,
            bin,
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
            .args([
                "-c",
                "listen_addresses=",
                "-c",
                "fsync=off",
                "-c",
                "full_page_writes=off",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
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
        let ready = wait_for(
            &self.dir.join(".s.PGSQL.5432"),
            &mut child,
            "postgres",
            &log,
        );
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

    fn psql(&self, sql: &str) -> bool {
        Command::new("psql")
            .arg("-h")
            .arg(&self.dir)
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
        let _ = std::fs::remove_file(self.dir.join(".s.PGSQL.5432"));
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
            "postgres://postgres@localhost/test?host={}",
            self.dir.display()
        )
    }
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
}

impl MariaDbServer {
    /// Installs system tables in a temporary directory and starts the server.
    ///
    /// # Panics
    /// If MariaDB is not installed or does not start.
    pub fn start() -> Self {
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
        let mut child = Command::new("mariadbd")
            .arg("--no-defaults")
            .arg(format!("--user={}", current_user()))
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--pid-file={}", dir.join("mariadb.pid").display()))
            .arg(format!("--log-error={}", log.display()))
            .arg(format!("--tmpdir={}", tmp.display()))
            .args(["--skip-networking", "--innodb-flush-log-at-trx-commit=0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|_| panic!("{}", missing("MariaDB (mariadbd)")));
        wait_for(&socket, &mut child, "mariadbd", &log).unwrap_or_else(|e| panic!("{e}"));
        let this = Self {
            child: Some(child),
            dir,
        };
        let created = Command::new("mariadb")
            .arg("--no-defaults")
            .arg("-S")
            .arg(&socket)
            .args(["-u", "root", "-e", "CREATE DATABASE test"])
            .status()
            .is_ok_and(|s| s.success());
        assert!(created, "could not create the test database");
        this
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
