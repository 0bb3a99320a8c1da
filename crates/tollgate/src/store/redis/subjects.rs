//! The subjects a Redis store holds state for, listed with `SCAN` a
//! bounded number of steps a page ([`RedisStore::subjects`]).

use super::connection::Connection;
use super::{store_error, RedisStore};
use crate::error::{Error, ErrorKind, Result};
use crate::store::listing::{take_step, Position, SubjectPage};
use crate::subject::{subject_parts, SubjectPattern};

/// Keys one `SCAN` step looks at (its `COUNT`): a step takes Redis about
/// a quarter of a millisecond, so decisions queued behind it wait little.
pub const SCAN_COUNT: u64 = 250;
/// `SCAN` steps a page takes at most: a page looks at about
/// `SCAN_COUNT × SCAN_STEPS` keys (5 000), whatever the size of the store.
pub const SCAN_STEPS: usize = 20;

impl RedisStore {
    /// The subjects that fit `pattern` this store holds a key for under
    /// the limit `name`, a page of at most `limit` from `cursor` (a page's
    /// [`SubjectPage::cursor`]; none: from the start): at most
    /// 20 `SCAN` steps of 250 keys each, so a page
    /// costs Redis about as much at a million keys as at a hundred (it may
    /// then hold few subjects, or none, with a cursor to follow). As `SCAN`:
    /// a key held from the listing's start to its end is listed; one
    /// written or dropped meanwhile may or may not be, and one may come
    /// twice if Redis resized its table meanwhile.
    ///
    /// # Errors
    ///
    /// A cursor this store did not give; a Cluster (its keys are spread
    /// over nodes; not listed); a store fault or no answer within the
    /// store's timeout.
    pub async fn subjects(
        &self,
        pattern: &SubjectPattern,
        name: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<SubjectPage> {
        let mut at = Position::parse(cursor)?;
        let connection = &self.inner.client.connection;
        if matches!(connection, Connection::Cluster(_)) {
            return Err(Error::invalid_argument(
                "listing the subjects held needs one Redis server or Sentinel, not a Cluster",
            ));
        }
        let head = format!("{}:{{", glob_escaped(self.prefix()));
        let tail = format!("}}:{}", glob_escaped(name));
        let glob = format!("{head}{}{tail}", pattern.glob());
        let (key_head, key_tail) = (format!("{}:{{", self.prefix()), format!("}}:{name}"));
        let timeout = self.inner.timeout;
        let mut page = SubjectPage::default();
        for _ in 0..SCAN_STEPS {
            let mut command = redis::cmd("SCAN");
            command
                .arg(at.step)
                .arg("MATCH")
                .arg(&glob)
                .arg("COUNT")
                .arg(SCAN_COUNT);
            let (next, keys): (u64, Vec<String>) = tokio::time::timeout(timeout, connection.query(&command))
                .await
                .map_err(|_| Error::new(ErrorKind::Timeout, format!("redis: no answer within {timeout:?}")))?
                .map_err(store_error)?;
            let fitting = keys
                .iter()
                .filter_map(|key| key.strip_prefix(key_head.as_str())?.strip_suffix(key_tail.as_str()))
                .filter(|subject| pattern.matches(subject))
                .filter_map(subject_parts)
                .collect();
            if let Some(rest) = take_step(&mut page.subjects, fitting, at, limit) {
                page.cursor = Some(rest.cursor());
                return Ok(page);
            }
            if next == 0 {
                return Ok(page);
            }
            at = Position { step: next, skip: 0 };
            if page.subjects.len() == limit {
                break;
            }
        }
        page.cursor = Some(at.cursor());
        Ok(page)
    }
}

/// `text` matched as it is by a `MATCH` glob.
fn glob_escaped(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for char in text.chars() {
        if matches!(char, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(char);
    }
    escaped
}
