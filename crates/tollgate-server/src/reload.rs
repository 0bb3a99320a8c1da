//! Configuration files followed while serving: a change is read once the
//! events of a save settle, put in force when it can be used, and refused
//! (the running configuration stays) when it cannot.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::{mpsc, watch};

use crate::config::{Config, LoadOptions};
use crate::service::Service;

/// What the last look at the configuration files found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reload {
    /// The configuration given at start is in force.
    Initial,
    /// A changed configuration was loaded and is in force (`n`-th reload).
    Loaded(u64),
    /// A changed configuration was refused; the previous one stays.
    Failed(String),
}

/// What the configuration watcher watches.
pub(crate) struct Watching {
    /// The configuration file or directory.
    pub(crate) path: PathBuf,
    /// How it is read.
    pub(crate) options: LoadOptions,
    /// Other paths whose change means a reload (a swapped link's directory).
    pub(crate) also: Vec<PathBuf>,
}

/// Watches the configuration file or directory and reloads it when it
/// changes; a configuration that cannot be used is reported and the running
/// one stays in force.
pub(crate) fn watch_config(
    watching: Watching,
    service: Arc<Service>,
    reloads: watch::Sender<Reload>,
    mut stopped: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let (changed, mut changes) = mpsc::unbounded_channel();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|event| !event.kind.is_access()) {
            let _ = changed.send(());
        }
    })
    .map_err(std::io::Error::other)?;
    // Editors replace files rather than write them: watch the directory.
    let path = watching.path;
    let directory = if path.is_dir() {
        path.clone()
    } else {
        path.parent().unwrap_or(Path::new(".")).to_owned()
    };
    if !directory.is_dir() {
        // As upstream with FORCE_START_WITHOUT_INITIAL_CONFIG: serve without
        // limits; there is nothing to watch until a restart.
        tracing::warn!(path = %directory.display(), "the configuration directory does not exist: not watched");
        return Ok(());
    }
    let mode = if watching.options.runtime_layout {
        RecursiveMode::Recursive
    } else {
        RecursiveMode::NonRecursive
    };
    watcher.watch(&directory, mode).map_err(std::io::Error::other)?;
    for also in &watching.also {
        watcher
            .watch(also, RecursiveMode::NonRecursive)
            .map_err(std::io::Error::other)?;
    }
    let options = watching.options;
    let rewatch = !watching.also.is_empty();
    tokio::spawn(async move {
        let mut generation = 0;
        loop {
            tokio::select! {
                change = changes.recv() => if change.is_none() { return },
                _ = stopped.wait_for(|stop| *stop) => return,
            }
            // A save is often several events: let them settle, then read once.
            tokio::time::sleep(Duration::from_millis(50)).await;
            while changes.try_recv().is_ok() {}
            if rewatch {
                // A swapped link: the directory behind the path may be new.
                let _ = watcher.unwatch(&directory);
                let _ = watcher.watch(&directory, mode);
            }
            match Config::load_with(&path, options) {
                Ok(config) => {
                    generation += 1;
                    service.replace_config(config);
                    service.metrics().config_loaded(true);
                    tracing::info!(path = %path.display(), generation, "configuration reloaded");
                    service.config_applied(&format!("file {}", path.display()));
                    let _ = reloads.send(Reload::Loaded(generation));
                }
                Err(error) => {
                    service.metrics().config_loaded(false);
                    tracing::error!(%error, "configuration refused; the previous one stays in force");
                    service.config_refused(&error.to_string());
                    let _ = reloads.send(Reload::Failed(error.to_string()));
                }
            }
        }
    });
    Ok(())
}
