//! Private PostgreSQL and MariaDB servers for tests, on unix sockets in a
//! temporary directory, with no network listener; stopped on drop.
//!
//! PostgreSQL refuses to run as root, so when the tests run as root the
//! server runs as the `postgres` user that Debian's package creates.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn temp_dir(kind: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "hasp-{kind}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

fn missing(what: &str) -> ! {
    panic!("{what} not found: the tests need it. Run `scripts/ensure-deps.sh` (installs it with apt-get)")
}

fn wait_for(path: &Path, child: &mut Child, what: &str, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "{what} exited with {status}: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not start within 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
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
}

impl PostgresServer {
    /// Initialises a cluster in a temporary directory and starts it.
    ///
    /// # Panics
    /// If PostgreSQL is not installed or does not start.
    pub fn start() -> Self {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .ok()
            .and_then(|versions| {
                versions
                    .filter_map(Result::ok)
                    .map(|v| v.path().join("bin"))
                    .filter(|b| b.join("initdb").exists())
                    .max()
            })
            .unwrap_or_else(|| missing("PostgreSQL (initdb)"));
        let dir = temp_dir("postgres");
        let as_user = |cmd: &mut Command| {
            if running_as_root() {
                let (uid, gid) =
                    user_ids("postgres").unwrap_or_else(|| missing("the postgres user"));
                cmd.uid(uid).gid(gid);
            }
        };
        if running_as_root() {
            let status = Command::new("chown")
                .arg("-R")
                .arg("postgres:")
                .arg(&dir)
                .status()
                .expect("chown");
            assert!(status.success(), "chown of the PostgreSQL directory failed");
        }
        let log = dir.join("postgres.log");
        let mut init = Command::new(bin.join("initdb"));
        init.arg("-D")
            .arg(dir.join("data"))
            .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        as_user(&mut init);
        assert!(
            init.status().expect("run initdb").success(),
            "initdb failed"
        );
        let mut server = Command::new(bin.join("postgres"));
        server
            .arg("-D")
            .arg(dir.join("data"))
            .arg("-k")
            .arg(&dir)
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
            .stderr(std::fs::File::create(&log).expect("log file"));
        as_user(&mut server);
        let mut child = server.spawn().expect("start postgres");
        wait_for(&dir.join(".s.PGSQL.5432"), &mut child, "postgres", &log);
        let this = Self {
            child: Some(child),
            dir,
        };
        // The socket appears a moment before connections are accepted.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !this.psql("CREATE DATABASE test") {
            assert!(
                Instant::now() < deadline,
                "postgres never accepted connections"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        this
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

    /// URL of the `test` database (sqlx form, unix socket).
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@localhost/test?host={}",
            self.dir.display()
        )
    }
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
        let dir = temp_dir("mariadb");
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
            Err(_) => missing("MariaDB (mariadb-install-db)"),
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
            .unwrap_or_else(|_| missing("MariaDB (mariadbd)"));
        wait_for(&socket, &mut child, "mariadbd", &log);
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
