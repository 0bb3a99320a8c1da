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
//! the same reply, decided by the same Rust code as Tollgate's memory store
//! ([`tollgate::engine`]). Keys keep the Lua library's encodings, so module
//! and Lua clients can share a server. `RedisStore` uses the command when
//! the server has it and the library otherwise.
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
use std::os::raw::c_long;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis_module::{
    key::KeyFlags, raw::KeyType, redis_module, CallOptionsBuilder, CallResult, Context, NextArg, RedisError,
    RedisResult, RedisString, RedisValue,
};
use tollgate::engine::{Engine, Keyspace, Value};

/// The calling convention's version, answered by `TOLLGATE.VERSION`: a
/// client checks it before using the module.
const PROTOCOL: i64 = 1;

thread_local! {
    /// The engine, with the limits it has parsed; commands run on the
    /// server's main thread only.
    static ENGINE: RefCell<Engine> = RefCell::new(Engine::new());
}

/// The server's keyspace, seen from inside one command.
struct Server<'a> {
    ctx: &'a Context,
    /// The command's keys, as the server passed them.
    keys: &'a [RedisString],
    /// The time read for this call (µs), once read.
    now: Option<u64>,
}

impl Server<'_> {
    /// The key named `bytes`: one of the command's own (the engine only
    /// names those), found by address, without copying it.
    fn name(&self, bytes: &[u8]) -> RedisString {
        match self.keys.iter().find(|key| key.as_slice().as_ptr() == bytes.as_ptr()) {
            Some(key) => key.clone(),
            None => self.ctx.create_string(bytes),
        }
    }

    /// Runs a write command, replicated as it is.
    fn write(&self, command: &str, args: &[&[u8]]) {
        let options = CallOptionsBuilder::new().replicate().build();
        let _: CallResult<'_> = self.ctx.call_ext(command, &options, args);
    }

    /// Runs a read command and returns its reply.
    fn read_command(&self, command: &str, args: &[&[u8]]) -> Option<Vec<RedisValue>> {
        match self.ctx.call(command, args) {
            Ok(RedisValue::Array(items)) => Some(items),
            _ => None,
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

impl Keyspace for Server<'_> {
    fn now(&mut self) -> u64 {
        *self.now.get_or_insert_with(clock_micros)
    }

    fn read(&mut self, key: &[u8]) -> Value {
        let name = self.name(key);
        let opened = self.ctx.open_key_with_flags(&name, KeyFlags::NOTOUCH);
        match opened.key_type() {
            KeyType::Empty => Value::Missing,
            KeyType::String => match opened.read() {
                Ok(Some(value)) => Value::String(value.to_vec()),
                _ => Value::Missing,
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
        let name = self.name(key);
        let opened = self.ctx.open_key_writable(&name);
        let written = matches!(opened.key_type(), KeyType::Empty | KeyType::String)
            && opened
                .as_string_dma()
                .and_then(|mut dma| dma.write(value).map(|_| ()))
                .is_ok()
            && opened.set_expire(Duration::from_millis(expire_ms)).is_ok();
        if written {
            // The effect, with the expiry as an instant: a replica applies
            // it as it is, however late it reads it.
            let at = (self.now() / 1000).saturating_add(expire_ms);
            let mut digits = itoa::Buffer::new();
            self.ctx
                .replicate("SET", &[key, value, b"PXAT", digits.format(at).as_bytes()]);
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
        now: None,
    };
    let reply = ENGINE
        .with(|engine| engine.borrow_mut().run(&mut server, &keys, &args))
        .map_err(|error| RedisError::String(format!("ERR tollgate: {error}")))?;
    // Written straight to the client: no array of values built first.
    let raw = ctx.get_raw();
    redis_module::raw::reply_with_array(raw, c_long::try_from(reply.len()).unwrap_or(c_long::MAX));
    for integer in reply {
        redis_module::raw::reply_with_long_long(raw, integer);
    }
    Ok(RedisValue::NoReply)
}

/// `TOLLGATE.VERSION`: the calling convention's version.
fn version(_: &Context, _: Vec<RedisString>) -> RedisResult {
    Ok(RedisValue::Integer(PROTOCOL))
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
    commands: [
        ["tollgate.decide", decide, "write deny-oom getkeys-api", 0, 0, 0, ""],
        ["tollgate.version", version, "readonly fast", 0, 0, 0, ""],
    ],
}
