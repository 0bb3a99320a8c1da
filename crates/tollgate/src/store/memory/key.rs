//! The keys of the memory store's slots: `(subject, limit name)` in 24
//! bytes, and where one limit of one subject lives.

use std::hash::BuildHasher as _;

use super::Hasher;
use crate::policy::name_hash;

/// Bytes of a key kept inline; longer keys go to the heap.
const INLINE: usize = 21;

/// The bytes of `(subject, limit name)`, in 24 bytes: inline when short (an
/// IPv4 address and a short limit name fit), so that a lookup reads one
/// cache line, else behind one pointer.
pub(super) enum Key {
    Inline { len: u8, split: u8, bytes: [u8; INLINE] },
    Heap { split: u16, bytes: Box<[u8]> },
}

const _: () = assert!(size_of::<Key>() == 24);

impl Key {
    pub(super) fn new(subject: &str, name: &str) -> Self {
        let len = subject.len() + name.len();
        if let (Ok(short), Ok(split)) = (u8::try_from(len), u8::try_from(subject.len())) {
            if len <= INLINE {
                let mut bytes = [0; INLINE];
                bytes[..subject.len()].copy_from_slice(subject.as_bytes());
                bytes[subject.len()..len].copy_from_slice(name.as_bytes());
                return Self::Inline {
                    len: short,
                    split,
                    bytes,
                };
            }
        }
        Self::Heap {
            // Subject encodings are at most `MAX_KEY_LEN` (200) bytes.
            split: u16::try_from(subject.len()).unwrap_or(u16::MAX),
            bytes: [subject.as_bytes(), name.as_bytes()].concat().into_boxed_slice(),
        }
    }

    /// The subject's bytes and the name's.
    #[inline]
    pub(super) fn parts(&self) -> (&[u8], &[u8]) {
        match self {
            Self::Inline { len, split, bytes } => bytes[..usize::from(*len)].split_at(usize::from(*split)),
            Self::Heap { split, bytes } => bytes.split_at(usize::from(*split)),
        }
    }

    #[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
    #[inline(always)]
    fn is(&self, subject: &str, name: &str) -> bool {
        let (key_subject, key_name) = self.parts();
        same(key_subject, subject.as_bytes()) && same(key_name, name.as_bytes())
    }
}

/// Where one limit of one subject lives: the subject's key, the limit's
/// name, and the hash of both.
#[derive(Clone, Copy)]
pub(super) struct Place<'a> {
    pub(super) hash: u64,
    pub(super) key: &'a str,
    pub(super) name: &'a str,
}

impl<'a> Place<'a> {
    /// Where `name` (hashed to `name_hash`) of the subject `key` (hashed
    /// to `subject_hash`) lives.
    #[inline]
    pub(super) fn of(subject_hash: u64, key: &'a str, name: &'a str, name_hash: u64) -> Self {
        Self {
            hash: slot_hash(subject_hash, name_hash),
            key,
            name,
        }
    }

    #[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
    #[inline(always)]
    pub(super) fn holds(&self, key: &Key) -> bool {
        key.is(self.key, self.name)
    }
}

/// Equal bytes, compared inline: keys are short, and a call to `memcmp`
/// costs more than the comparison.
#[allow(clippy::inline_always)] // the memory store's hot path (BENCHMARKS.md, "In process")
#[inline(always)]
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let (mut a_words, mut b_words) = (a.chunks_exact(8), b.chunks_exact(8));
    let words_equal = a_words.by_ref().zip(b_words.by_ref()).all(|(x, y)| {
        u64::from_ne_bytes(x.try_into().unwrap_or_default()) == u64::from_ne_bytes(y.try_into().unwrap_or_default())
    });
    words_equal && a_words.remainder().iter().zip(b_words.remainder()).all(|(x, y)| x == y)
}

/// The hash of a slot: its subject's (which also picks the shard), mixed
/// with its name's, which the policy keeps, so that a lookup hashes only
/// the subject.
#[inline]
fn slot_hash(subject_hash: u64, name_hash: u64) -> u64 {
    subject_hash ^ name_hash.rotate_left(23)
}

/// The hash of the slot of `key`, as [`Place::of`] computes it.
pub(super) fn key_hash(hasher: Hasher, key: &Key) -> u64 {
    let (subject, name) = key.parts();
    slot_hash(hasher.hash_one(subject), name_hash(name))
}
