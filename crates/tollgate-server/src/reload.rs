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
    // A file's directory is watched, but only a change to the file itself
    // means a reload: a log written beside it must not reload it on every
    // line. (A swapped link, `also`, changes other names: any change then.)
    let only = (!watching.path.is_dir() && watching.also.is_empty())
        .then(|| watching.path.file_name().map(ToOwned::to_owned))
        .flatten();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|event| means_a_reload(&event, only.as_deref())) {
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

/// True when `event` in the watched directory means a reload: a change
/// (not a read) to the file named `only`, or to anything when none.
fn means_a_reload(event: &notify::Event, only: Option<&std::ffi::OsStr>) -> bool {
    let ours =
        only.is_none_or(|name| event.paths.is_empty() || event.paths.iter().any(|path| path.file_name() == Some(name)));
    ours && !event.kind.is_access()
}

#[cfg(test)]
mod tests {
    use notify::event::{AccessKind, CreateKind, ModifyKind, RenameMode};
    use notify::{Event, EventKind};

    use super::*;

    #[test]
    fn only_a_change_to_the_file_itself_reloads_it() {
        let only = Some(std::ffi::OsStr::new("limits.yaml"));
        let event = |kind: EventKind, paths: &[&str]| {
            let mut event = Event::new(kind);
            for path in paths {
                event = event.add_path(PathBuf::from(path));
            }
            event
        };
        let write = EventKind::Modify(ModifyKind::Any);
        assert!(means_a_reload(&event(write, &["/etc/tollgate/limits.yaml"]), only));
        // A log written beside it, over and over: nothing.
        assert!(!means_a_reload(&event(write, &["/etc/tollgate/serve.log"]), only));
        // An editor's save: a new file renamed over it.
        let rename = EventKind::Modify(ModifyKind::Name(RenameMode::Both));
        assert!(means_a_reload(
            &event(rename, &["/etc/tollgate/.limits.yaml.swp", "/etc/tollgate/limits.yaml"]),
            only
        ));
        assert!(means_a_reload(
            &event(EventKind::Create(CreateKind::File), &["/etc/tollgate/limits.yaml"]),
            only
        ));
        // Read, not changed; and a directory watched whole reloads on any change.
        assert!(!means_a_reload(
            &event(EventKind::Access(AccessKind::Any), &["/etc/tollgate/limits.yaml"]),
            only
        ));
        assert!(means_a_reload(&event(write, &["/etc/tollgate/serve.log"]), None));
    }
}
