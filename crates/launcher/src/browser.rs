//! A private `chromedriver` (the WebDriver server of Chromium) on a free
//! port of 127.0.0.1, for tests that drive a real headless browser.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::LaunchError;
use crate::redis::free_tcp_port;

/// How long chromedriver may take to answer on its port.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// A running `chromedriver`, stopped when dropped.
#[derive(Debug)]
pub struct ChromeDriver {
    child: Child,
    port: u16,
    chromium: PathBuf,
}

impl ChromeDriver {
    /// Starts `chromedriver` for the Chromium at `/usr/bin/chromium` (or
    /// the first `chromium` on `PATH`).
    ///
    /// # Errors
    /// [`LaunchError::Missing`] if chromedriver or Chromium is not
    /// installed (Debian: `apt-get install chromium chromium-driver`);
    /// [`LaunchError::Failed`] if it does not answer within 30 s.
    pub fn try_start() -> Result<Self, LaunchError> {
        let missing = |what: &str| {
            LaunchError::Missing(format!(
                "{what} not found: install Debian's chromium and chromium-driver (scripts/ensure-deps.sh does)"
            ))
        };
        let driver = find("chromedriver").ok_or_else(|| missing("chromedriver"))?;
        let chromium = find("chromium").ok_or_else(|| missing("chromium"))?;
        let port = free_tcp_port();
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| LaunchError::io("starting chromedriver", e))?;
        let mut driver = Self {
            child,
            port,
            chromium,
        };
        let deadline = Instant::now() + READY_WITHIN;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = driver.child.try_wait() {
                return Err(LaunchError::Failed(format!(
                    "chromedriver exited: {status}"
                )));
            }
            if Instant::now() > deadline {
                return Err(LaunchError::Failed(format!(
                    "chromedriver did not answer on port {port} within {READY_WITHIN:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(driver)
    }

    /// As [`try_start`](Self::try_start).
    ///
    /// # Panics
    /// Where `try_start` returns an error, with its message.
    pub fn start() -> Self {
        Self::try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// The WebDriver URL (`http://127.0.0.1:<port>`).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The Chromium binary the sessions should use.
    pub fn chromium(&self) -> &std::path::Path {
        &self.chromium
    }
}

impl Drop for ChromeDriver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `/usr/bin/<name>`, else the first `<name>` on `PATH`.
fn find(name: &str) -> Option<PathBuf> {
    let system = PathBuf::from("/usr/bin").join(name);
    if system.is_file() {
        return Some(system);
    }
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}
