//! Subjects: who or what a limit applies to (an IP and a route, a user id…).
//!
//! A subject is built from parts, never formatted by hand:
//! `Subject::new(ip).and("/login")`. Each part is percent-encoded so that the
//! encoding is injective — a part containing `:`, `{`, `}`, `%`, spaces,
//! unicode or arbitrary bytes can never make two different subjects share a
//! key — and parts are joined by `:`. The result is safe inside a Redis
//! Cluster hash tag (it never holds `{` or `}`). Encodings longer than
//! [`MAX_KEY_LEN`] bytes are replaced by `#` and the hex SHA-256 of the
//! encoding; `#` never starts an unhashed encoding.

use std::fmt::{self, Write as _};

use sha2::{Digest, Sha256};

/// Encoded subjects longer than this many bytes are hashed.
pub const MAX_KEY_LEN: usize = 200;

/// Who a limit applies to; see the module docs.
#[derive(Clone)]
pub struct Subject {
    key: String,
    parts: usize,
}

impl PartialEq for Subject {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl Eq for Subject {}

impl std::hash::Hash for Subject {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key.hash(state);
    }
}

fn unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric()
        || matches!(
            byte,
            b'-' | b'_' | b'.' | b'~' | b'/' | b'@' | b'=' | b'+' | b'!' | b',' | b';'
        )
}

fn encode_part(key: &mut String, part: &[u8]) {
    for &byte in part {
        if unreserved(byte) {
            key.push(char::from(byte));
        } else {
            let _ = write!(key, "%{byte:02X}");
        }
    }
}

impl Subject {
    fn empty() -> Self {
        Self {
            key: String::new(),
            parts: 0,
        }
    }

    /// A subject of one part, written with its `Display` form.
    pub fn new(part: impl fmt::Display) -> Self {
        Self::empty().and(part)
    }

    /// A subject of one part given as raw bytes.
    pub fn from_bytes(part: &[u8]) -> Self {
        Self::empty().and_bytes(part)
    }

    /// A subject of several parts.
    pub fn from_parts<P: fmt::Display>(parts: impl IntoIterator<Item = P>) -> Self {
        let mut parts = parts.into_iter();
        let first = parts.next().map_or_else(|| Self::new(""), Self::new);
        parts.fold(first, Self::and)
    }

    /// This subject with one more part (an IP, then a route…).
    #[must_use]
    pub fn and(self, part: impl fmt::Display) -> Self {
        self.and_bytes(part.to_string().as_bytes())
    }

    /// This subject with one more part given as raw bytes.
    #[must_use]
    pub fn and_bytes(mut self, part: &[u8]) -> Self {
        if self.parts > 0 {
            self.key.push(':');
        }
        self.parts += 1;
        encode_part(&mut self.key, part);
        if self.key.len() > MAX_KEY_LEN {
            let digest = Sha256::digest(self.key.as_bytes());
            let mut hashed = String::with_capacity(65);
            hashed.push('#');
            for byte in digest {
                let _ = write!(hashed, "{byte:02x}");
            }
            self.key = hashed;
        }
        self
    }

    /// The encoded form: the part of a store key between `{` and `}`.
    pub fn as_key(&self) -> &str {
        &self.key
    }

    /// The subject whose encoded form is `key` (what [`Subject::as_key`]
    /// gave): read back from a store.
    #[cfg(feature = "redis")]
    pub(crate) fn from_key(key: &str) -> Self {
        Self {
            key: key.to_owned(),
            parts: key.split(':').count(),
        }
    }
}

/// The parts of an encoded subject ([`Subject::as_key`]), decoded (bytes
/// that are not UTF-8 replaced); none for a hashed one (`#…`).
pub fn subject_parts(key: &str) -> Option<Vec<String>> {
    if key.starts_with('#') {
        return None;
    }
    Some(key.split(':').map(decode_part).collect())
}

fn decode_part(part: &str) -> String {
    let bytes = part.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let decoded = bytes
            .get(at + 1..at + 3)
            .filter(|_| bytes[at] == b'%')
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        if let Some(decoded) = decoded {
            out.push(decoded);
            at += 3;
        } else {
            out.push(bytes[at]);
            at += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Subjects of a shape: a number of parts, some fixed, the others any
/// value (a store lists the subjects it holds state for that fit,
/// [`MemoryStore::subjects`](crate::MemoryStore::subjects)). Hashed
/// subjects (longer than [`MAX_KEY_LEN`] encoded) fit none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubjectPattern {
    /// Each part encoded, or none for any value.
    parts: Vec<Option<String>>,
}

impl SubjectPattern {
    /// The pattern of these parts: `Some(value)` fixed, `None` any.
    pub fn new<P: AsRef<[u8]>>(parts: impl IntoIterator<Item = Option<P>>) -> Self {
        let parts = parts
            .into_iter()
            .map(|part| {
                part.map(|part| {
                    let mut encoded = String::new();
                    encode_part(&mut encoded, part.as_ref());
                    encoded
                })
            })
            .collect();
        Self { parts }
    }

    /// True when the encoded subject `key` fits.
    pub fn matches(&self, key: &str) -> bool {
        let mut parts = key.split(':');
        let fits = self.parts.iter().all(|wanted| match (parts.next(), wanted) {
            (Some(part), Some(wanted)) => part == wanted,
            (Some(_), None) => true,
            (None, _) => false,
        });
        fits && parts.next().is_none() && !key.starts_with('#')
    }

    /// A Redis `MATCH` glob that every fitting subject's encoding fits
    /// (and some others: [`Self::matches`] decides). Encoded parts never
    /// hold a glob's special characters.
    pub fn glob(&self) -> String {
        self.parts
            .iter()
            .map(|part| part.as_deref().unwrap_or("*"))
            .collect::<Vec<_>>()
            .join(":")
    }
}

impl fmt::Debug for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Subject({})", self.key)
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key)
    }
}

impl From<&str> for Subject {
    fn from(part: &str) -> Self {
        Self::new(part)
    }
}

impl From<String> for Subject {
    fn from(part: String) -> Self {
        Self::new(part)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn subject(parts: &[Vec<u8>]) -> Subject {
        let mut parts = parts.iter();
        let first = Subject::from_bytes(parts.next().map_or(&[][..], Vec::as_slice));
        parts.fold(first, |subject, part| subject.and_bytes(part))
    }

    fn part() -> impl Strategy<Value = Vec<u8>> {
        let tricky = prop::sample::select(vec![b':', b'{', b'}', b'%', b' ', b'#', b'a', b'0', 0xff, 0x00, 0xc3]);
        prop_oneof![
            prop::collection::vec(tricky, 0..12),
            prop::collection::vec(any::<u8>(), 0..300),
        ]
    }

    proptest! {
        /// Different sequences of parts never share a key, and no key can
        /// end a Redis Cluster hash tag early.
        #[test]
        fn the_encoding_is_injective(a in prop::collection::vec(part(), 1..4), b in prop::collection::vec(part(), 1..4)) {
            let (left, right) = (subject(&a), subject(&b));
            prop_assert_eq!(a == b, left == right, "{:?} vs {:?}", left, right);
            for key in [left.as_key(), right.as_key()] {
                prop_assert!(!key.contains(['{', '}']), "{} holds a brace", key);
                prop_assert!(key.len() <= MAX_KEY_LEN || key.len() == 65);
            }
        }
    }

    #[test]
    fn a_pattern_fits_the_subjects_of_its_shape() {
        let pattern = SubjectPattern::new([Some("llm"), Some("tenant"), Some("a:b"), Some("model"), None]);
        let fits = |subject: Subject| pattern.matches(subject.as_key());
        assert!(fits(Subject::from_parts(["llm", "tenant", "a:b", "model", "gpt-4"])));
        assert!(fits(Subject::from_parts(["llm", "tenant", "a:b", "model", "*?[x]"])));
        assert!(!fits(Subject::from_parts(["llm", "tenant", "a", "model", "gpt-4"])));
        assert!(!fits(Subject::from_parts(["llm", "tenant", "a:b", "model"])));
        assert!(!fits(Subject::from_parts([
            "llm", "tenant", "a:b", "model", "x", "y", "z"
        ])));
        assert!(!fits(Subject::from_parts([
            "llm",
            "tenant",
            "a:b",
            "model",
            "x".repeat(300).as_str()
        ])));
        assert_eq!(pattern.glob(), "llm:tenant:a%3Ab:model:*");
        let subject = Subject::from_parts(["llm", "a:b c", "é%"]);
        assert_eq!(subject_parts(subject.as_key()).unwrap(), ["llm", "a:b c", "é%"]);
        assert_eq!(subject_parts(Subject::new("x".repeat(300)).as_key()), None);
    }

    #[test]
    fn keys_are_readable_and_long_ones_hashed() {
        assert_eq!(Subject::new("203.0.113.7").and("/login").as_key(), "203.0.113.7:/login");
        assert_eq!(Subject::new("a:b").as_key(), "a%3Ab");
        assert_eq!(Subject::new("").and("").as_key(), ":");
        let long = Subject::new("x".repeat(300));
        assert!(long.as_key().starts_with('#'));
        assert_eq!(long.as_key().len(), 65);
        assert_ne!(long, Subject::new("x".repeat(301)));
    }
}
