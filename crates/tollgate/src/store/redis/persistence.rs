//! Whether the Redis server keeps anything across a restart: what a budget
//! of a day or longer needs, and what `tollgate serve` warns about.

use std::fmt;

use super::{store_error, RedisStore};
use crate::error::{Error, ErrorKind, Result};

/// What the server keeps across a restart, as its configuration says
/// (`CONFIG GET appendonly`, `CONFIG GET save`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Persistence {
    /// It writes an append-only file and/or snapshots.
    Persists {
        /// `appendonly yes`: every write logged (fsynced per `appendfsync`).
        aof: bool,
        /// A `save` schedule: snapshots, losing what came after the last.
        snapshots: bool,
    },
    /// Neither: a restart forgets every key.
    Nothing,
    /// The server did not say (`CONFIG` refused, as managed services and
    /// ACLs often do): why.
    Unknown(String),
}

impl Persistence {
    /// True when a restart forgets every key.
    pub fn forgets_on_restart(&self) -> bool {
        matches!(self, Self::Nothing)
    }

    /// `aof`, `snapshots`, `aof+snapshots`, `none` or `unknown`: a metric's label.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Persists {
                aof: true,
                snapshots: true,
            } => "aof+snapshots",
            Self::Persists { aof: true, .. } => "aof",
            Self::Persists { .. } => "snapshots",
            Self::Nothing => "none",
            Self::Unknown(_) => "unknown",
        }
    }
}

impl fmt::Display for Persistence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Persists { aof, snapshots } => {
                let mut kinds = Vec::new();
                if *aof {
                    kinds.push("an append-only file");
                }
                if *snapshots {
                    kinds.push("snapshots");
                }
                write!(f, "persists ({})", kinds.join(" and "))
            }
            Self::Nothing => f.write_str("persists nothing (appendonly no, save \"\"): a restart forgets every key"),
            Self::Unknown(why) => write!(f, "cannot tell whether it persists: {why}"),
        }
    }
}

impl RedisStore {
    /// What the server keeps across a restart (read-only: `CONFIG GET`).
    /// On a Cluster, the node a plain command goes to; behind Sentinels,
    /// the master.
    ///
    /// # Errors
    ///
    /// A store fault or no answer in time; a server that refuses `CONFIG`
    /// is [`Persistence::Unknown`], not an error.
    pub async fn persistence(&self) -> Result<Persistence> {
        let timeout = self.inner.timeout;
        let connection = &self.inner.client.connection;
        let ask = |parameter: &'static str| async move {
            let mut command = redis::cmd("CONFIG");
            command.arg("GET").arg(parameter);
            tokio::time::timeout(timeout, connection.query::<Vec<String>>(&command))
                .await
                .map_err(|_| Error::new(ErrorKind::Timeout, format!("redis: no answer within {timeout:?}")))
        };
        let (appendonly, save) = match (ask("appendonly").await?, ask("save").await?) {
            (Ok(appendonly), Ok(save)) => (appendonly, save),
            (Err(error), _) | (_, Err(error)) => {
                let refused = matches!(error.code(), Some("NOPERM" | "ERR"))
                    || super::connection::Fault::of(&error) == super::connection::Fault::UnknownCommand;
                return if refused {
                    Ok(Persistence::Unknown(format!("CONFIG GET was refused ({error})")))
                } else {
                    Err(store_error(error))
                };
            }
        };
        let value = |reply: &[String]| reply.get(1).cloned().unwrap_or_default();
        let aof = value(&appendonly).eq_ignore_ascii_case("yes");
        let snapshots = !value(&save).trim().is_empty();
        Ok(if aof || snapshots {
            Persistence::Persists { aof, snapshots }
        } else {
            Persistence::Nothing
        })
    }
}
