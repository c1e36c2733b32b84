//! The settings flags of `seckill serve`, `migrate` and `reconcile`: a
//! [`Layer`] of flags and environment variables over an optional TOML file
//! (`--config`), over the defaults (see `seckill::settings`).

use std::path::PathBuf;

use seckill::settings::{Layer, Settings, Storage};

/// Flags (and their environment variables) of `seckill serve`.
#[derive(Debug, Default, clap::Args)]
pub struct ServeArgs {
    /// A TOML file with any of the settings below (snake_case keys).
    #[arg(long, env = "SECKILL_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub layer: Layer,
}

impl ServeArgs {
    /// Flags and environment over the file.
    fn layers(self) -> anyhow::Result<Layer> {
        let file = match &self.config {
            Some(path) => Layer::from_file(path)?,
            None => Layer::default(),
        };
        Ok(self.layer.over(file))
    }

    /// Every setting, resolved and checked.
    ///
    /// # Errors
    /// An unreadable or invalid file, an invalid value, or no token secret.
    pub fn resolve(self) -> anyhow::Result<Settings> {
        Ok(self.layers()?.resolve()?)
    }

    /// Where the data lives (no token secret needed).
    ///
    /// # Errors
    /// An unreadable or invalid file, or an invalid prefix.
    pub fn storage(self) -> anyhow::Result<Storage> {
        Ok(self.layers()?.storage()?)
    }
}
