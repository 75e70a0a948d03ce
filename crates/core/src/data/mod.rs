//! Redis' data types and key expiry, as one deterministic function of a key's stored value.
//!
//! A typed command (LPUSH, ZADD, SADD, EXPIRE, ...) travels as [`ExecOp`]: its RESP argument
//! vector, the coordinator's clock reading `now_ms` and the size limit. [`apply`] decodes the
//! key's value ([`value`]), runs the command and re-encodes the value, so every protocol runs
//! it as one read-modify-write of one key, exactly as it runs INCRBY: linearizable per key,
//! and identical at every replica because the clock reading travels with the op.
//!
//! Read-only commands (LRANGE, ZSCORE, TTL, ...) run the same function on a locally read
//! value; if that finds the key expired, the server re-runs the command as an [`ExecOp`] so
//! that the expiry is decided by a replicated write (docs/expiry.md).

pub mod dump;
pub mod geo;
mod hashes;
pub mod hll;
mod keys;
pub mod lcs;
mod list;
mod set;
pub mod stream;
mod strings;
pub mod value;
mod zset;

use bytes::Bytes;

use crate::command::{Outcome, RmwEffect};
pub use value::{has_deadline, is_reserved, Entry, Typed};

/// A typed command, run as one read-modify-write of its key.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ExecOp {
    /// The coordinating replica's wall clock (ms since the Unix epoch) when it submitted the
    /// command: relative expiry (EX, PX) counts from it and deadlines are judged against it.
    pub now_ms: u64,
    /// The largest encoded value the command may leave (`value_bytes_max`).
    pub bytes_max: u32,
    /// The command as the client sent it, name first.
    pub args: Vec<Bytes>,
}

/// A reply, in RESP terms, independent of the server's reply type.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Data {
    Nil,
    NilArray,
    Integer(i64),
    Bulk(Bytes),
    Status(String),
    Array(Vec<Data>),
    /// Field/value pairs (a RESP3 map, a flat array in RESP2).
    Map(Vec<(Data, Data)>),
    /// A whole error line, e.g. `ERR syntax error`.
    Error(String),
}

impl Data {
    pub fn ok() -> Data {
        Data::Status("OK".into())
    }
    pub fn bulk(bytes: impl AsRef<[u8]>) -> Data {
        Data::Bulk(Bytes::copy_from_slice(bytes.as_ref()))
    }
    pub fn optional(value: Option<Bytes>) -> Data {
        value.map_or(Data::Nil, Data::Bulk)
    }
    pub fn double(value: f64) -> Data {
        Data::bulk(format_double(value))
    }
    pub fn bulks(items: impl IntoIterator<Item = Bytes>) -> Data {
        Data::Array(items.into_iter().map(Data::Bulk).collect())
    }
}

/// A command's failure: the whole error line.
pub type Fail = String;
pub type Reply = Result<Data, Fail>;

pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

pub fn syntax_error() -> Fail {
    "ERR syntax error".into()
}
pub fn not_integer() -> Fail {
    "ERR value is not an integer or out of range".into()
}
pub fn not_float() -> Fail {
    "ERR value is not a valid float".into()
}
fn arity(name: &str) -> Fail {
    format!("ERR wrong number of arguments for '{name}' command")
}

/// Whether a command is run by [`apply`], and whether it only reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// The commands [`apply`] runs: name, arity (Redis' convention: negative = at least), access.
pub const COMMANDS: &[(&str, i64, Access)] = {
    use Access::{Read as R, Write as W};
    &[
        // strings and expiry
        ("set", -3, W),
        ("setnx", 3, W),
        ("getset", 3, W),
        ("setex", 4, W),
        ("psetex", 4, W),
        ("get", 2, R),
        ("getex", -2, W),
        ("getdel", 2, W),
        ("append", 3, W),
        ("strlen", 2, R),
        ("getrange", 4, R),
        ("substr", 4, R),
        ("setrange", 4, W),
        ("incr", 2, W),
        ("decr", 2, W),
        ("incrby", 3, W),
        ("decrby", 3, W),
        ("incrbyfloat", 3, W),
        ("setbit", 4, W),
        ("bitfield", -2, W),
        ("pfadd", -2, W),
        ("pfcount", -2, R),
        ("bitfield_ro", -2, R),
        ("getbit", 3, R),
        ("bitcount", -2, R),
        ("bitpos", -3, R),
        ("expire", -3, W),
        ("pexpire", -3, W),
        ("expireat", -3, W),
        ("pexpireat", -3, W),
        ("persist", 2, W),
        ("ttl", 2, R),
        ("pttl", 2, R),
        ("expiretime", 2, R),
        ("pexpiretime", 2, R),
        ("type", 2, R),
        ("del", 2, W),
        ("exists", 2, R),
        ("touch", 2, R),
        ("object", 3, R),
        ("memory", -3, R),
        ("dump", 2, R),
        ("restore", -4, W),
        // hashes
        ("hset", -4, W),
        ("hmset", -4, W),
        ("hsetnx", 4, W),
        ("hdel", -3, W),
        ("hget", 3, R),
        ("hmget", -3, R),
        ("hgetall", 2, R),
        ("hexists", 3, R),
        ("hlen", 2, R),
        ("hkeys", 2, R),
        ("hvals", 2, R),
        ("hstrlen", 3, R),
        ("hincrby", 4, W),
        ("hincrbyfloat", 4, W),
        ("hrandfield", -2, R),
        ("hscan", -3, R),
        // lists
        ("lpush", -3, W),
        ("rpush", -3, W),
        ("lpushx", -3, W),
        ("rpushx", -3, W),
        ("lpop", -2, W),
        ("rpop", -2, W),
        ("lrange", 4, R),
        ("llen", 2, R),
        ("lindex", 3, R),
        ("lset", 4, W),
        ("lrem", 4, W),
        ("ltrim", 4, W),
        ("linsert", 5, W),
        ("lpos", -3, R),
        // sets
        ("sadd", -3, W),
        ("srem", -3, W),
        ("smembers", 2, R),
        ("sismember", 3, R),
        ("smismember", -3, R),
        ("scard", 2, R),
        ("spop", -2, W),
        ("srandmember", -2, R),
        ("sscan", -3, R),
        // sorted sets
        ("zadd", -4, W),
        ("zincrby", 4, W),
        ("zrem", -3, W),
        ("zscore", 3, R),
        ("zmscore", -3, R),
        ("zcard", 2, R),
        ("zcount", 4, R),
        ("zlexcount", 4, R),
        ("zrange", -4, R),
        ("zrangebyscore", -4, R),
        ("zrevrangebyscore", -4, R),
        ("zrangebylex", -4, R),
        ("zrevrangebylex", -4, R),
        ("zrevrange", -4, R),
        ("zrank", -3, R),
        ("zrevrank", -3, R),
        ("zpopmin", -2, W),
        ("zpopmax", -2, W),
        ("zremrangebyscore", 4, W),
        ("zremrangebyrank", 4, W),
        ("zremrangebylex", 4, W),
        ("zrandmember", -2, R),
        ("zscan", -3, R),
        // geo, on sorted sets
        ("geoadd", -5, W),
        ("geopos", -2, R),
        ("geodist", -4, R),
        ("geohash", -2, R),
        ("geosearch", -7, R),
        ("georadius", -6, R),
        ("georadius_ro", -6, R),
        ("georadiusbymember", -5, R),
        ("georadiusbymember_ro", -5, R),
        // streams (XREAD/XREADGROUP over several keys are split into one op per key)
        ("xadd", -5, W),
        ("xlen", 2, R),
        ("xrange", -4, R),
        ("xrevrange", -4, R),
        ("xdel", -3, W),
        ("xtrim", -4, W),
        ("xsetid", -3, W),
        ("xread", -4, R),
        ("xreadgroup", -7, W),
        ("xgroup", -4, W),
        ("xack", -4, W),
        ("xpending", -3, R),
        ("xclaim", -6, W),
        ("xautoclaim", -6, W),
        ("xinfo", -3, R),
    ]
};

/// The access of a command [`apply`] runs (`name` lower case); `None` if it is not one.
pub fn access(name: &str) -> Option<Access> {
    COMMANDS.iter().find(|(command, _, _)| *command == name).map(|(_, _, access)| *access)
}

/// The key a typed command works on, after its arguments were checked against [`COMMANDS`].
pub fn key_of(args: &[Bytes]) -> &Bytes {
    let name = args[0].to_ascii_lowercase();
    match name.as_slice() {
        b"object" | b"memory" | b"xgroup" | b"xinfo" => &args[2],
        b"xread" | b"xreadgroup" => key_of_stream_read(args),
        _ => &args[1],
    }
}

/// The key of XREAD/XREADGROUP `... STREAMS key id` (the server splits several keys into
/// one op each); the last argument but one if the command is malformed (it then fails).
pub fn key_of_stream_read(args: &[Bytes]) -> &Bytes {
    let streams = args.iter().position(|arg| arg.eq_ignore_ascii_case(b"streams"));
    match streams {
        Some(at) if at + 1 < args.len() => &args[at + 1],
        _ => &args[args.len().saturating_sub(2).max(1).min(args.len() - 1)],
    }
}

/// At most how many bytes the key's encoded value has after `op`, given its size before:
/// what a protocol that reserves room before applying (chain) sets aside. Every element an
/// op adds comes from its arguments (16 bytes of framing each covers any element's
/// encoding), a deadline or a type header fits in 64 bytes, a float's text in 64 more;
/// SETRANGE and SETBIT may grow a string to their offset. Never above `op.bytes_max`: a
/// larger result is refused, not written.
pub fn bytes_bound(op: &ExecOp, current_bytes: usize) -> usize {
    if let Some(batch) = Batch::parse(&op.args) {
        // Each command of a transaction grows the value from where the previous one left it.
        return batch.commands.iter().fold(current_bytes, |bytes, args| {
            bytes_bound(&ExecOp { now_ms: op.now_ms, bytes_max: op.bytes_max, args: args.clone() }, bytes)
        });
    }
    const ARG_FRAMING_BYTES: usize = 16;
    const HEADER_BYTES: usize = 128;
    let added: usize = op.args.iter().map(|arg| arg.len() + ARG_FRAMING_BYTES).sum();
    let name = op.args.first().map(|name| name.to_ascii_lowercase()).unwrap_or_default();
    let offset = |at: usize| op.args.get(at).and_then(|arg| parse_int(arg).ok()).unwrap_or(0).max(0) as usize;
    let grown_to = match name.as_slice() {
        b"setrange" => offset(2).saturating_add(op.args.get(3).map_or(0, |patch| patch.len())),
        b"setbit" => offset(2) / 8 + 1,
        b"pfadd" => hll::DENSE_BYTES,
        b"bitfield" => strings::bitfield_bytes(&Args { all: &op.args }),
        // A delivery or a claim adds a pending entry per stream entry: bounded only by the
        // limit itself.
        b"xreadgroup" | b"xclaim" | b"xautoclaim" => return op.bytes_max as usize,
        _ => 0,
    };
    current_bytes.max(grown_to).saturating_add(added + HEADER_BYTES).min(op.bytes_max as usize)
}

/// The key as a command sees it, plus what the command did to it.
pub struct Slot {
    entry: Option<Entry>,
    now_ms: u64,
}

impl Slot {
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }
    pub fn entry(&self) -> Option<&Entry> {
        self.entry.as_ref()
    }
    pub fn value(&self) -> Option<&Typed> {
        self.entry.as_ref().map(|entry| &entry.value)
    }
    pub fn exists(&self) -> bool {
        self.entry.is_some()
    }
    /// Replace the whole key (`None` deletes it).
    pub fn put(&mut self, entry: Option<Entry>) {
        self.entry = entry;
    }
    pub fn take(&mut self) -> Option<Entry> {
        self.entry.take()
    }
    pub fn set_deadline(&mut self, deadline_ms: Option<u64>) {
        if let Some(entry) = &mut self.entry {
            entry.deadline_ms = deadline_ms;
        }
    }
    /// The value, created empty (by `empty`) if absent; WRONGTYPE if it is another type.
    fn value_mut_or(&mut self, empty: Typed) -> Result<&mut Typed, Fail> {
        if let Some(entry) = &self.entry {
            if std::mem::discriminant(&entry.value) != std::mem::discriminant(&empty) {
                return Err(WRONGTYPE.into());
            }
        }
        Ok(&mut self.entry.get_or_insert(Entry { value: empty, deadline_ms: None }).value)
    }
}

macro_rules! typed_access {
    ($get:ident, $get_mut:ident, $variant:ident, $ty:ty, $empty:expr) => {
        impl Slot {
            /// The value if it is of this type (`None` when absent); WRONGTYPE otherwise.
            pub fn $get(&self) -> Result<Option<&$ty>, Fail> {
                match self.value() {
                    None => Ok(None),
                    Some(Typed::$variant(inner)) => Ok(Some(inner)),
                    Some(_) => Err(WRONGTYPE.into()),
                }
            }
            /// The value for changing, created empty if absent; WRONGTYPE for another type.
            pub fn $get_mut(&mut self) -> Result<&mut $ty, Fail> {
                match self.value_mut_or(Typed::$variant($empty))? {
                    Typed::$variant(inner) => Ok(inner),
                    _ => unreachable!("value_mut_or checked the type"),
                }
            }
        }
    };
}

typed_access!(string, string_mut, String, Bytes, Bytes::new());
typed_access!(hash, hash_mut, Hash, crate::hash::Fields, Vec::new());
typed_access!(list, list_mut, List, Vec<Bytes>, Vec::new());
typed_access!(set, set_mut, Set, std::collections::BTreeSet<Bytes>, Default::default());
typed_access!(zset, zset_mut, ZSet, std::collections::BTreeMap<Bytes, f64>, Default::default());
typed_access!(stream, stream_mut, Stream, Box<stream::Stream>, Default::default());

/// Run a typed command against a key's stored value. Pure and deterministic: the same op on
/// the same value gives the same effect at every replica.
pub fn apply(op: &ExecOp, current: Option<&Bytes>) -> RmwEffect {
    if let Some(batch) = Batch::parse(&op.args) {
        return batch.apply(op, current);
    }
    let fail = |line: Fail| RmwEffect { write: None, outcome: Outcome::Data(Data::Error(line)) };
    let (entry, expired) = match current.map(value::decode).transpose() {
        Ok(Some(entry)) if entry.deadline_ms.is_some_and(|deadline| deadline <= op.now_ms) => (None, true),
        Ok(entry) => (entry, false),
        Err(value::Corrupt) => return fail("ERR stored value is corrupt".into()),
    };
    let mut slot = Slot { entry, now_ms: op.now_ms };
    let reply = run(&op.args, &mut slot);
    let new = slot.entry.as_ref().and_then(value::encode);
    let changed = new.as_ref() != current;
    match reply {
        // A failed command changes nothing, but an expired key it found is deleted all the
        // same: once one replica decided it expired, every later operation must agree.
        Err(line) => RmwEffect { write: expired.then_some(None), outcome: Outcome::Data(Data::Error(line)) },
        Ok(_) if new.as_ref().is_some_and(|new| new.len() > op.bytes_max as usize) => {
            fail("ERR the value would exceed the size limit (value_bytes_max)".into())
        }
        Ok(data) => RmwEffect { write: changed.then_some(new), outcome: Outcome::Data(data) },
    }
}

fn run(args: &[Bytes], slot: &mut Slot) -> Reply {
    let Some(first) = args.first() else { return Err(syntax_error()) };
    let name = String::from_utf8_lossy(first).to_ascii_lowercase();
    let Some((_, arity_of, _)) = COMMANDS.iter().find(|(command, _, _)| *command == name) else {
        return Err(format!("ERR unknown command '{name}'"));
    };
    let count = args.len() as i64;
    if (*arity_of >= 0 && count != *arity_of) || (*arity_of < 0 && count < -arity_of) {
        return Err(arity(&name));
    }
    let args = Args { all: args };
    strings::run(&name, &args, slot)
        .or_else(|| keys::run(&name, &args, slot))
        .or_else(|| dump::run(&name, &args, slot))
        .or_else(|| hashes::run(&name, &args, slot))
        .or_else(|| list::run(&name, &args, slot))
        .or_else(|| set::run(&name, &args, slot))
        .or_else(|| zset::run(&name, &args, slot))
        .or_else(|| geo::run(&name, &args, slot))
        .or_else(|| stream::run(&name, &args, slot))
        .or_else(|| hll::run(&name, &args, slot))
        .unwrap_or_else(|| Err(format!("ERR unknown command '{name}'")))
}

/// A command's arguments (index 0 is the name, 1 usually the key).
pub struct Args<'a> {
    all: &'a [Bytes],
}

impl<'a> Args<'a> {
    pub fn len(&self) -> usize {
        self.all.len()
    }
    pub fn is_empty(&self) -> bool {
        self.all.is_empty()
    }
    pub fn get(&self, at: usize) -> &'a Bytes {
        &self.all[at]
    }
    pub fn from(&self, at: usize) -> &'a [Bytes] {
        &self.all[at.min(self.all.len())..]
    }
    pub fn int(&self, at: usize) -> Result<i64, Fail> {
        parse_int(&self.all[at])
    }
    pub fn float(&self, at: usize) -> Result<f64, Fail> {
        parse_float(&self.all[at])
    }
    /// The argument upper-cased, for keywords.
    pub fn word(&self, at: usize) -> String {
        String::from_utf8_lossy(&self.all[at]).to_ascii_uppercase()
    }
}

pub fn parse_int(arg: &[u8]) -> Result<i64, Fail> {
    let text = std::str::from_utf8(arg).map_err(|_| not_integer())?;
    let number: i64 = text.parse().map_err(|_| not_integer())?;
    if number.to_string() != text && !(text.starts_with('+') || text == "-0") {
        return Err(not_integer());
    }
    Ok(number)
}

/// A float as Redis reads it (`inf`, `-inf`, `+inf` allowed; NaN refused).
pub fn parse_float(arg: &[u8]) -> Result<f64, Fail> {
    let text = std::str::from_utf8(arg).map_err(|_| not_float())?;
    let lower = text.to_ascii_lowercase();
    let number: f64 = match lower.as_str() {
        "inf" | "+inf" | "infinity" | "+infinity" => f64::INFINITY,
        "-inf" | "-infinity" => f64::NEG_INFINITY,
        _ if text.trim() != text || text.is_empty() => return Err(not_float()),
        _ if lower.contains("inf") || lower.contains("nan") => return Err(not_float()),
        _ => text.parse().map_err(|_| not_float())?,
    };
    Ok(number)
}

/// A double as Redis prints it: the shortest text that reads back the same, `inf`/`-inf`.
pub fn format_double(value: f64) -> String {
    if value.is_infinite() {
        return if value > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if value == 0.0 {
        return if value.is_sign_negative() { "-0".into() } else { "0".into() };
    }
    let text = format!("{value}");
    if text.len() > 24 {
        // Very large or small magnitudes: exponent form, as Redis' %.17g would.
        let text = format!("{value:e}");
        return text.replace("e", "e+").replace("e+-", "e-");
    }
    text
}

/// Redis' glob match (`*`, `?`, `[abc]`, `[a-z]`, `[^a]`, `\x`), byte-wise.
pub fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let (mut star, mut star_t) = (None, 0);
    while t < text.len() {
        if p < pattern.len() {
            match pattern[p] {
                b'*' => {
                    star = Some(p);
                    star_t = t;
                    p += 1;
                    continue;
                }
                b'?' => {
                    p += 1;
                    t += 1;
                    continue;
                }
                b'[' => {
                    if let Some((matched, next)) = class_match(pattern, p, text[t]) {
                        if matched {
                            p = next;
                            t += 1;
                            continue;
                        }
                    }
                }
                b'\\' if p + 1 < pattern.len() && pattern[p + 1] == text[t] => {
                    p += 2;
                    t += 1;
                    continue;
                }
                // An escape that does not match: no literal match for the backslash either.
                b'\\' if p + 1 < pattern.len() => {}
                byte if byte == text[t] => {
                    p += 1;
                    t += 1;
                    continue;
                }
                _ => {}
            }
        }
        match star {
            Some(s) => {
                p = s + 1;
                star_t += 1;
                t = star_t;
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|c| *c == b'*')
}

/// `[...]` at `pattern[at]`: whether `byte` matches, and where the class ends.
fn class_match(pattern: &[u8], at: usize, byte: u8) -> Option<(bool, usize)> {
    let mut i = at + 1;
    let negate = pattern.get(i) == Some(&b'^');
    if negate {
        i += 1;
    }
    let mut matched = false;
    while i < pattern.len() && pattern[i] != b']' {
        if pattern[i] == b'\\' && i + 1 < pattern.len() {
            matched |= pattern[i + 1] == byte;
            i += 2;
        } else if i + 2 < pattern.len() && pattern[i + 1] == b'-' && pattern[i + 2] != b']' {
            let (low, high) = (pattern[i].min(pattern[i + 2]), pattern[i].max(pattern[i + 2]));
            matched |= (low..=high).contains(&byte);
            i += 3;
        } else {
            matched |= pattern[i] == byte;
            i += 1;
        }
    }
    (i < pattern.len()).then_some((matched != negate, i + 1))
}

/// Deterministic pseudo-random numbers for SPOP and friends: seeded from the command and the
/// value, so every replica that applies the op picks the same members.
pub struct Pick(u64);

impl Pick {
    pub fn seeded(args: &Args, extra: u64) -> Pick {
        let mut seed = 0xcbf2_9ce4_8422_2325u64 ^ extra;
        for arg in args.all {
            for byte in arg.iter() {
                seed = (seed ^ *byte as u64).wrapping_mul(0x0100_0000_01b3);
            }
        }
        Pick(seed)
    }
    pub fn below(&mut self, bound: usize) -> usize {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % bound.max(1) as u64) as usize
    }
}

/// Redis' range arithmetic for LRANGE/ZRANGE/GETRANGE: negative indexes count from the end;
/// the inclusive range clamped to `0..len`, or `None` when empty.
pub fn clamp_range(start: i64, stop: i64, len: usize) -> Option<(usize, usize)> {
    let len = len as i64;
    let start = if start < 0 { (len + start).max(0) } else { start };
    let stop = if stop < 0 { len + stop } else { stop.min(len - 1) };
    (start <= stop && start < len).then_some((start as usize, stop as usize))
}

/// A SCAN-family cursor over `items` (sorted, stable): `cursor` is the index to resume at.
pub fn scan_page<T: Clone>(
    items: &[T],
    args: &Args,
    from: usize,
    name_of: impl Fn(&T) -> &[u8],
) -> Result<(u64, Vec<T>), Fail> {
    let cursor =
        parse_int(args.get(2)).ok().filter(|c| *c >= 0).ok_or_else(|| "ERR invalid cursor".to_string())?;
    let (mut pattern, mut count, mut i) = (None, 10usize, from);
    while i < args.len() {
        match args.word(i).as_str() {
            "MATCH" if i + 1 < args.len() => pattern = Some(args.get(i + 1).clone()),
            "COUNT" if i + 1 < args.len() => {
                count = usize::try_from(args.int(i + 1)?).ok().filter(|c| *c > 0).ok_or_else(syntax_error)?
            }
            "NOVALUES" => {
                i += 1;
                continue;
            }
            _ => return Err(syntax_error()),
        }
        i += 2;
    }
    let start = (cursor as usize).min(items.len());
    let end = start.saturating_add(count).min(items.len());
    let page = items[start..end]
        .iter()
        .filter(|item| pattern.as_ref().is_none_or(|p| glob_match(p, name_of(item))))
        .cloned()
        .collect();
    Ok((if end == items.len() { 0 } else { end as u64 }, page))
}

#[cfg(test)]
mod tests;

/// The first argument of a transaction on one key: not a Redis command, so no client can
/// send it (the server only builds it from MULTI ... EXEC).
pub const BATCH: &str = "chorus-batch";

/// MULTI/EXEC on one key, as one `ExecOp`: the commands run one after the other on the key's
/// value inside one RMW, so on every protocol they are atomic (no other command on the key
/// sees or lands between them). With a WATCH guard, nothing runs and the reply is a nil array
/// (Redis' aborted EXEC) unless the key still holds the value WATCH read and has not expired.
///
/// Arguments: `chorus-batch key guard [value] (count args...)...`, where `guard` is `-` (no
/// WATCH), `absent` or `value` (followed by the value read).
#[derive(Debug, PartialEq)]
pub struct Batch {
    pub key: Bytes,
    /// `Some(expected)`: the value WATCH read (`None`: absent).
    pub guard: Option<Option<Bytes>>,
    pub commands: Vec<Vec<Bytes>>,
}

impl Batch {
    pub fn args(&self) -> Vec<Bytes> {
        let mut args = vec![Bytes::from_static(BATCH.as_bytes()), self.key.clone()];
        match &self.guard {
            None => args.push(Bytes::from_static(b"-")),
            Some(None) => args.push(Bytes::from_static(b"absent")),
            Some(Some(value)) => args.extend([Bytes::from_static(b"value"), value.clone()]),
        }
        for command in &self.commands {
            args.push(Bytes::from(command.len().to_string()));
            args.extend(command.iter().cloned());
        }
        args
    }

    /// `None` unless `args` is a well-formed batch.
    pub fn parse(args: &[Bytes]) -> Option<Batch> {
        if args.first()?.as_ref() != BATCH.as_bytes() {
            return None;
        }
        let key = args.get(1)?.clone();
        let (guard, mut at) = match args.get(2)?.as_ref() {
            b"-" => (None, 3),
            b"absent" => (Some(None), 3),
            b"value" => (Some(Some(args.get(3)?.clone())), 4),
            _ => return None,
        };
        let mut commands = Vec::new();
        while at < args.len() {
            let count: usize = std::str::from_utf8(&args[at]).ok()?.parse().ok()?;
            let command = args.get(at + 1..at + 1 + count)?;
            if command.is_empty() {
                return None;
            }
            commands.push(command.to_vec());
            at += 1 + count;
        }
        Some(Batch { key, guard, commands })
    }

    fn apply(&self, op: &ExecOp, current: Option<&Bytes>) -> RmwEffect {
        if let Some(expected) = &self.guard {
            let expired = match current.map(value::decode) {
                Some(Ok(entry)) => entry.deadline_ms.is_some_and(|deadline| deadline <= op.now_ms),
                _ => false,
            };
            if expected.as_ref() != current || expired {
                // Redis counts a watched key that expired as changed. The expired key is
                // deleted all the same, as by any operation that finds it expired.
                return RmwEffect { write: expired.then_some(None), outcome: Outcome::Data(Data::NilArray) };
            }
        }
        let mut value = current.cloned();
        let mut wrote = false;
        let mut replies = Vec::with_capacity(self.commands.len());
        for args in &self.commands {
            let one = ExecOp { now_ms: op.now_ms, bytes_max: op.bytes_max, args: args.clone() };
            let effect = apply(&one, value.as_ref());
            if let Some(write) = effect.write {
                value = write;
                wrote = true;
            }
            replies.push(match effect.outcome {
                Outcome::Data(data) => data,
                other => Data::Error(format!("ERR internal error: {other:?}")),
            });
        }
        RmwEffect {
            write: (wrote && value.as_ref() != current).then_some(value),
            outcome: Outcome::Data(Data::Array(replies)),
        }
    }
}
