//! Tollgate's native engine as a Redis (7+) and Valkey (8+) module.
//!
//! Load it with `redis-server --loadmodule target/release/libtollgate_redis_module.so`
//! (or `MODULE LOAD`). It adds one command,
//!
//! ```text
//! TOLLGATE.DECIDE numkeys key [key …] arg [arg …]
//! ```
//!
//! which takes the keys and arguments Tollgate's functions library takes
//! (`FCALL <library> numkeys key… arg…`: a batch of decisions) and answers
//! the same reply (its integers packed as 8-byte little-endian words in one
//! bulk string), decided by the same Rust code as Tollgate's memory store
//! ([`tollgate::engine`]). Keys keep the Lua library's encodings, so module
//! and Lua clients can share a server. `RedisStore` uses the command when
//! the server has it and the library otherwise.
//!
//! **Sorted sets.** A sliding log's or a concurrency limit's set is read
//! through the module API's sorted-set calls (first or last in a score
//! range, next, previous, a member's score) on the key held open: only the
//! members the decision needs, which the algorithm names
//! (`Algorithm::fetch`), so no command runs and the cost does not grow
//! with the set.
//!
//! **Replication.** What a decision writes is replicated (the effects, never
//! the command: a replica re-running a decision would make it at another
//! time), wrapped by the server in one `MULTI`/`EXEC` per call. Expiries go
//! to replicas as absolute instants (`PXAT`, as Redis 7 propagates `SET … PX`).
//!
//! **Why `redis-module`.** It is the maintained Rust binding of the module
//! API (also used by RedisJSON and RediSearch's Rust parts), and its API is
//! the one Valkey keeps: the same `.so` loads into both.

use std::cell::RefCell;
use std::os::raw::{c_int, c_longlong};
use std::time::{SystemTime, UNIX_EPOCH};

use redis_module::{
    raw::{self, KeyType, ModuleOptions},
    redis_module, CallOptionsBuilder, CallResult, Context, NextArg, RedisError, RedisResult, RedisString, RedisValue,
};
use tollgate::engine::protocol::{self, PROTOCOL};
use tollgate::engine::{Engine, Keyspace, Scores, SortedSet, Value, Visit};

thread_local! {
    /// The engine, with the limits it has parsed; commands run on the
    /// server's main thread only.
    static ENGINE: RefCell<Engine> = RefCell::new(Engine::new());
}

/// A key opened for reading and writing; closed when dropped.
struct OpenKey(*mut raw::RedisModuleKey);

impl OpenKey {
    fn open(ctx: &Context, name: &RedisString) -> Self {
        Self(raw::open_key(
            ctx.get_raw(),
            name.inner,
            raw::KeyMode::READ | raw::KeyMode::WRITE,
        ))
    }

    fn key_type(&self) -> KeyType {
        // SAFETY: the module API's function (set on load), on a key this
        // handle holds open.
        unsafe { raw::RedisModule_KeyType.map_or(KeyType::Empty, |key_type| key_type(self.0).into()) }
    }

    /// The bytes of a string value.
    fn bytes(&self) -> Option<&[u8]> {
        let mut len = 0;
        let at = raw::string_dma(self.0, &mut len, raw::KeyMode::READ);
        // SAFETY: the server lends `len` bytes at `at` until the key is
        // closed or written, and `self` is borrowed meanwhile.
        (!at.is_null()).then(|| unsafe { std::slice::from_raw_parts(at.cast::<u8>(), len) })
    }

    /// Makes the key a string holding `value` that expires in `expire_ms`.
    fn write(&self, value: &[u8], expire_ms: u64) -> bool {
        if raw::string_truncate(self.0, value.len()) != raw::Status::Ok {
            return false;
        }
        let mut len = 0;
        let at = raw::string_dma(self.0, &mut len, raw::KeyMode::WRITE);
        if at.is_null() || len != value.len() {
            return false;
        }
        // SAFETY: the server lends `len` writable bytes at `at`, the
        // string truncated to `value`'s length just above.
        unsafe { std::slice::from_raw_parts_mut(at.cast::<u8>(), len) }.copy_from_slice(value);
        raw::set_expire(self.0, c_longlong::try_from(expire_ms).unwrap_or(c_longlong::MAX)) == raw::Status::Ok
    }
}

/// The score of `member` in the sorted set open at `key`.
fn zset_score(ctx: *mut raw::RedisModuleCtx, key: *mut raw::RedisModuleKey, member: &[u8]) -> Option<i64> {
    let member = RedisString::create_from_slice(ctx, member);
    let mut score = 0.0;
    // SAFETY: the module API's function, on a key held open and a live string.
    let found = unsafe { raw::RedisModule_ZsetScore?(key, member.inner, &mut score) };
    // Tollgate's scores are integers below 2^53: exact as doubles.
    #[allow(clippy::cast_possible_truncation)]
    (found == raw::REDISMODULE_OK as c_int).then_some(score as i64)
}

/// A bound of a score range, as the module API takes it: the score, and
/// whether it is excluded.
fn bound(end: Option<(i64, bool)>, unbounded: f64) -> (f64, c_int) {
    #[allow(clippy::cast_precision_loss)]
    end.map_or((unbounded, 0), |(score, included)| {
        (score as f64, c_int::from(!included))
    })
}

impl Drop for OpenKey {
    fn drop(&mut self) {
        raw::close_key(self.0);
    }
}

/// The server's keyspace, seen from inside one command.
struct Server<'a> {
    ctx: &'a Context,
    /// The command's keys, as the server passed them.
    keys: &'a [RedisString],
    /// Their bytes, in the same order.
    key_bytes: &'a [&'a [u8]],
    /// The time read for this call (µs), once read.
    now: Option<u64>,
    /// Keys opened to be read, by their place among the command's keys:
    /// read again and `set` without looking them up again. Closed before a
    /// command runs through the server, which may replace the value a
    /// handle points at.
    open: Vec<(usize, OpenKey)>,
}

impl Server<'_> {
    /// The place of the key named `bytes` among the command's own keys
    /// (the engine only names those), found by address.
    fn position(&self, bytes: &[u8]) -> Option<usize> {
        self.key_bytes.iter().position(|key| key.as_ptr() == bytes.as_ptr())
    }

    /// The key named `bytes`, without copying it when it is the command's.
    fn name(&self, bytes: &[u8]) -> RedisString {
        match self.position(bytes) {
            Some(at) => self.keys[at].clone(),
            None => self.ctx.create_string(bytes),
        }
    }

    /// The key named `bytes`, held open for reading (and `set` after).
    fn held_open(&mut self, bytes: &[u8]) -> &OpenKey {
        let position = self.position(bytes).unwrap_or(usize::MAX);
        let index = match self.open.iter().position(|(at, _)| *at == position) {
            Some(index) => index,
            None => {
                let name = self.name(bytes);
                self.open.push((position, OpenKey::open(self.ctx, &name)));
                self.open.len() - 1
            }
        };
        &self.open[index].1
    }

    /// The key named `bytes`, opened by `read` or now.
    fn opened(&mut self, bytes: &[u8]) -> (OpenKey, RedisString) {
        let name = self.name(bytes);
        let position = self.position(bytes);
        match self.open.iter().position(|(at, _)| Some(*at) == position) {
            Some(index) => (self.open.swap_remove(index).1, name),
            None => (OpenKey::open(self.ctx, &name), name),
        }
    }

    /// Runs a write command, replicated as it is.
    fn write(&mut self, command: &str, args: &[&[u8]]) {
        self.open.clear();
        let options = CallOptionsBuilder::new().replicate().build();
        let _: CallResult<'_> = self.ctx.call_ext(command, &options, args);
    }

    /// Runs a read command and returns its reply.
    fn read_command(&mut self, command: &str, args: &[&[u8]]) -> Option<Vec<RedisValue>> {
        self.open.clear();
        match self.ctx.call(command, args) {
            Ok(RedisValue::Array(items)) => Some(items),
            _ => None,
        }
    }

    /// Tells the server that `name` changed to the string `value` expiring
    /// at `at_ms` (Unix ms): watchers and client caches, keyspace events,
    /// and the effect for replicas and the AOF, with the expiry as an
    /// instant (a replica applies it as it is, however late it reads it).
    fn written(&self, name: &RedisString, value: &[u8], at_ms: u64) {
        let ctx = self.ctx.get_raw();
        let mut digits = itoa::Buffer::new();
        let at = digits.format(at_ms).as_bytes();
        // SAFETY: the module API's functions, given live strings; `b`
        // takes a pointer and a length, `s` a module string, `c` a C string.
        unsafe {
            if let Some(signal) = raw::RedisModule_SignalModifiedKey {
                signal(ctx, name.inner);
            }
            if let Some(notify) = raw::RedisModule_NotifyKeyspaceEvent {
                notify(ctx, raw::REDISMODULE_NOTIFY_STRING, c"set".as_ptr(), name.inner);
                notify(ctx, raw::REDISMODULE_NOTIFY_GENERIC, c"expire".as_ptr(), name.inner);
            }
            if let Some(replicate) = raw::RedisModule_Replicate {
                replicate(
                    ctx,
                    c"SET".as_ptr(),
                    c"sbcb".as_ptr(),
                    name.inner,
                    value.as_ptr(),
                    value.len(),
                    c"PXAT".as_ptr(),
                    at.as_ptr(),
                    at.len(),
                );
            }
        }
    }
}

/// The server's time as the system clock gives it (as `TIME` reads it), µs.
fn clock_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| u64::try_from(since.as_micros()).unwrap_or(u64::MAX))
}

/// The bytes of a bulk string reply.
fn bytes(value: RedisValue) -> Option<Vec<u8>> {
    match value {
        RedisValue::StringBuffer(bytes) => Some(bytes),
        RedisValue::BulkString(text) | RedisValue::SimpleString(text) => Some(text.into_bytes()),
        RedisValue::BulkRedisString(text) => Some(text.as_slice().to_vec()),
        RedisValue::Integer(n) => Some(n.to_string().into_bytes()),
        _ => None,
    }
}

/// A sorted set's score, written by Tollgate as an integer.
fn score(text: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(text).ok()?;
    text.parse()
        .ok()
        .or_else(|| text.parse::<f64>().ok().map(|score| score as i64))
}

/// A sorted set read through the module API, on the key held open: no
/// command runs, nothing is copied but the members visited.
impl SortedSet for Server<'_> {
    fn is_sorted_set(&mut self, key: &[u8]) -> bool {
        self.held_open(key).key_type() == KeyType::ZSet
    }

    fn score(&mut self, key: &[u8], member: &[u8]) -> Option<i64> {
        let key = self.held_open(key).0;
        zset_score(self.ctx.get_raw(), key, member)
    }

    fn count(&mut self, key: &[u8], scores: Scores) -> u64 {
        fn end(bound: Option<(i64, bool)>, unbounded: &str) -> String {
            bound.map_or_else(
                || unbounded.to_owned(),
                |(score, included)| {
                    if included {
                        score.to_string()
                    } else {
                        format!("({score}")
                    }
                },
            )
        }
        let (min, max) = (end(scores.from, "-inf"), end(scores.to, "+inf"));
        // The module API counts no range: ZCOUNT, through the server (keys
        // held open are closed first, as read_command does).
        self.open.clear();
        match self.ctx.call("ZCOUNT", &[key, min.as_bytes(), max.as_bytes()][..]) {
            Ok(RedisValue::Integer(n)) => u64::try_from(n).unwrap_or(0),
            _ => 0,
        }
    }

    fn scan(&mut self, key: &[u8], scores: Scores, reverse: bool, visit: &mut Visit<'_>) {
        let key = self.held_open(key).0;
        let ctx = self.ctx.get_raw();
        let (min, min_excluded) = bound(scores.from, f64::NEG_INFINITY);
        let (max, max_excluded) = bound(scores.to, f64::INFINITY);
        // SAFETY: the module API's range functions, on a key held open and
        // not written while the range is walked; each element returned is
        // a new string, freed when its `RedisString` drops.
        unsafe {
            let (Some(first), Some(last), Some(next), Some(prev), Some(end), Some(current), Some(stop)) = (
                raw::RedisModule_ZsetFirstInScoreRange,
                raw::RedisModule_ZsetLastInScoreRange,
                raw::RedisModule_ZsetRangeNext,
                raw::RedisModule_ZsetRangePrev,
                raw::RedisModule_ZsetRangeEndReached,
                raw::RedisModule_ZsetRangeCurrentElement,
                raw::RedisModule_ZsetRangeStop,
            ) else {
                return;
            };
            let start = if reverse { last } else { first };
            if start(key, min, max, min_excluded, max_excluded) != raw::REDISMODULE_OK as c_int {
                return;
            }
            while end(key) == 0 {
                let mut score = 0.0;
                let element = current(key, &mut score);
                if element.is_null() {
                    break;
                }
                let element = RedisString::from_redis_module_string(ctx, element);
                #[allow(clippy::cast_possible_truncation)]
                let more = visit(element.as_slice(), score as i64, &mut |member| {
                    zset_score(ctx, key, member)
                });
                drop(element);
                if !more || (if reverse { prev(key) } else { next(key) }) == 0 {
                    break;
                }
            }
            stop(key);
        }
    }
}

impl Keyspace for Server<'_> {
    fn now(&mut self) -> u64 {
        *self.now.get_or_insert_with(clock_micros)
    }

    fn read(&mut self, key: &[u8]) -> Value {
        let opened = self.held_open(key);
        match opened.key_type() {
            KeyType::Empty => Value::Missing,
            KeyType::String => match opened.bytes() {
                Some(bytes) => Value::String(bytes.to_vec()),
                None => Value::Other,
            },
            KeyType::Hash => {
                let Some(items) = self.read_command("HGETALL", &[key]) else {
                    return Value::Other;
                };
                let mut fields = Vec::with_capacity(items.len() / 2);
                let mut items = items.into_iter();
                while let (Some(field), Some(value)) = (items.next(), items.next()) {
                    if let (Some(field), Some(value)) = (bytes(field), bytes(value)) {
                        fields.push((field, value));
                    }
                }
                Value::Hash(fields)
            }
            KeyType::ZSet => {
                let Some(items) = self.read_command("ZRANGE", &[key, b"0", b"-1", b"WITHSCORES"]) else {
                    return Value::Other;
                };
                let mut members = Vec::with_capacity(items.len() / 2);
                let mut items = items.into_iter();
                while let (Some(member), Some(value)) = (items.next(), items.next()) {
                    if let (Some(member), Some(value)) = (bytes(member), bytes(value).as_deref().and_then(score)) {
                        members.push((member, value));
                    }
                }
                Value::Zset(members)
            }
            _ => Value::Other,
        }
    }

    fn set(&mut self, key: &[u8], value: &[u8], expire_ms: u64) {
        let (opened, name) = self.opened(key);
        let written = matches!(opened.key_type(), KeyType::Empty | KeyType::String) && opened.write(value, expire_ms);
        drop(opened);
        if written {
            let at = (self.now() / 1000).saturating_add(expire_ms);
            self.written(&name, value, at);
        } else {
            // A key of another type: replaced by a plain SET.
            let mut digits = itoa::Buffer::new();
            self.write("SET", &[key, value, b"PX", digits.format(expire_ms).as_bytes()]);
        }
    }

    fn command(&mut self, args: &[&[u8]]) {
        let Some((command, args)) = args.split_first() else {
            return;
        };
        if let Ok(command) = std::str::from_utf8(command) {
            self.write(command, args);
        }
    }
}

/// `TOLLGATE.DECIDE numkeys key [key …] arg [arg …]`.
fn decide(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let count = args.len();
    let mut rest = args.into_iter().skip(1);
    let numkeys = rest.next_u64()?;
    let numkeys = usize::try_from(numkeys)
        .ok()
        .filter(|&numkeys| numkeys <= count - 2)
        .ok_or(RedisError::Str("ERR numkeys is larger than the number of arguments"))?;
    if ctx.is_keys_position_request() {
        for position in 0..numkeys {
            ctx.key_at_pos(i32::try_from(position + 2).unwrap_or(i32::MAX));
        }
        return Ok(RedisValue::NoReply);
    }
    let rest: Vec<RedisString> = rest.collect();
    let (names, args) = rest.split_at(numkeys);
    let keys: Vec<&[u8]> = names.iter().map(RedisString::as_slice).collect();
    let args: Vec<&[u8]> = args.iter().map(RedisString::as_slice).collect();
    let mut server = Server {
        ctx,
        keys: names,
        key_bytes: &keys,
        now: None,
        open: Vec::new(),
    };
    let reply = ENGINE
        .with(|engine| engine.borrow_mut().run(&mut server, &keys, &args))
        .map_err(|error| RedisError::String(format!("ERR tollgate: {error}")))?;
    // Packed as the Lua library packs its reply.
    let packed = protocol::pack(&reply);
    redis_module::raw::reply_with_string_buffer(ctx.get_raw(), packed.as_ptr().cast(), packed.len());
    Ok(RedisValue::NoReply)
}

/// `TOLLGATE.VERSION`: the calling convention's version.
fn version(_: &Context, _: Vec<RedisString>) -> RedisResult {
    Ok(RedisValue::Integer(PROTOCOL))
}

/// On load: a key the module opens for writing counts as changed only when
/// it writes it (a denial changes nothing a `WATCH` or a client cache sees).
fn init(ctx: &Context, _: &[RedisString]) -> redis_module::Status {
    ctx.set_module_options(ModuleOptions::NO_IMPLICIT_SIGNAL_MODIFIED);
    redis_module::Status::Ok
}

redis_module! {
    name: "tollgate",
    version: 1,
    // The system allocator: the module allocates only within a call (and
    // a small cache of parsed limits), so the server's accounting of its
    // memory gains nothing worth the extra `malloc_usable_size` per
    // allocation that RedisAlloc costs (12 % of the server's CPU, measured).
    allocator: (std::alloc::System, std::alloc::System),
    data_types: [],
    init: init,
    commands: [
        ["tollgate.decide", decide, "write deny-oom getkeys-api", 0, 0, 0, ""],
        ["tollgate.version", version, "readonly fast", 0, 0, 0, ""],
    ],
}
