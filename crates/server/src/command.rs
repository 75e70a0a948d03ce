//! RESP commands: parsing arguments into a typed [`Request`] and mapping single-key requests
//! onto [`chorus_core::Command`]s and their outcomes back onto replies. Pure functions, so the
//! whole mapping is unit-tested without a network.

use std::sync::LazyLock;

use bytes::Bytes;
use chorus_core::{Command, CommandError, Outcome, RmwOp};

use crate::resp::Reply;
use chorus_core::data::{self, Data, ExecOp};
use chorus_core::hash;

/// What `COMMAND` reports about a command (Redis' command table format).
pub struct CommandSpec {
    pub name: &'static str,
    /// Positive: exact argument count including the name; negative: at least that many.
    pub arity: i64,
    pub flags: &'static [&'static str],
    pub first_key: i64,
    pub last_key: i64,
    pub step: i64,
}

const fn spec(
    name: &'static str,
    arity: i64,
    flags: &'static [&'static str],
    keys: (i64, i64, i64),
) -> CommandSpec {
    CommandSpec { name, arity, flags, first_key: keys.0, last_key: keys.1, step: keys.2 }
}

const NO_KEYS: (i64, i64, i64) = (0, 0, 0);
const ONE_KEY: (i64, i64, i64) = (1, 1, 1);
const ALL_KEYS: (i64, i64, i64) = (1, -1, 1);

pub const COMMAND_TABLE: &[CommandSpec] = &[
    spec("ping", -1, &["fast", "stale"], NO_KEYS),
    spec("echo", 2, &["fast"], NO_KEYS),
    spec("hello", -1, &["noscript", "loading", "stale", "fast", "no_auth"], NO_KEYS),
    spec("auth", -2, &["noscript", "loading", "stale", "fast", "no_auth"], NO_KEYS),
    spec("select", 2, &["loading", "stale", "fast"], NO_KEYS),
    spec("quit", -1, &["noscript", "loading", "stale", "fast", "no_auth"], NO_KEYS),
    spec("reset", 1, &["noscript", "loading", "stale", "fast", "no_auth"], NO_KEYS),
    spec("get", 2, &["readonly", "fast"], ONE_KEY),
    spec("set", -3, &["write", "denyoom"], ONE_KEY),
    spec("setnx", 3, &["write", "denyoom", "fast"], ONE_KEY),
    spec("getset", 3, &["write", "denyoom", "fast"], ONE_KEY),
    spec("del", -2, &["write"], ALL_KEYS),
    spec("unlink", -2, &["write", "fast"], ALL_KEYS),
    spec("exists", -2, &["readonly", "fast"], ALL_KEYS),
    spec("incr", 2, &["write", "denyoom", "fast"], ONE_KEY),
    spec("decr", 2, &["write", "denyoom", "fast"], ONE_KEY),
    spec("incrby", 3, &["write", "denyoom", "fast"], ONE_KEY),
    spec("decrby", 3, &["write", "denyoom", "fast"], ONE_KEY),
    spec("mget", -2, &["readonly", "fast"], ALL_KEYS),
    spec("mset", -3, &["write", "denyoom"], (1, -1, 2)),
    spec("hset", -4, &["write", "denyoom", "fast"], ONE_KEY),
    spec("hmset", -4, &["write", "denyoom", "fast"], ONE_KEY),
    spec("hget", 3, &["readonly", "fast"], ONE_KEY),
    spec("hmget", -3, &["readonly", "fast"], ONE_KEY),
    spec("hgetall", 2, &["readonly"], ONE_KEY),
    spec("hdel", -3, &["write", "fast"], ONE_KEY),
    spec("dbsize", 1, &["readonly", "fast"], NO_KEYS),
    spec("flushall", -1, &["write"], NO_KEYS),
    spec("flushdb", -1, &["write"], NO_KEYS),
    spec("info", -1, &["loading", "stale"], NO_KEYS),
    spec("config", -2, &["admin", "noscript", "loading", "stale"], NO_KEYS),
    spec("command", -1, &["loading", "stale"], NO_KEYS),
    spec("client", -2, &["admin", "noscript", "loading", "stale"], NO_KEYS),
    spec("wait", 3, &["noscript"], NO_KEYS),
    spec("waitaof", 4, &["noscript"], NO_KEYS),
    spec("cas", 4, &["write", "denyoom"], ONE_KEY),
    spec("session", -5, &["write", "denyoom"], (4, 4, 1)),
    spec("multi", 1, &["noscript", "loading", "stale", "fast"], NO_KEYS),
    spec("exec", 1, &["noscript", "loading", "stale", "skip_slowlog"], NO_KEYS),
    spec("discard", 1, &["noscript", "loading", "stale", "fast"], NO_KEYS),
    spec("watch", -2, &["noscript", "loading", "stale", "fast"], ALL_KEYS),
    spec("unwatch", 1, &["noscript", "loading", "stale", "fast"], NO_KEYS),
    spec("shutdown", -1, &["admin", "noscript", "loading", "stale", "no_multi"], NO_KEYS),
    // Server and keyspace commands (docs/resp.md).
    spec("time", 1, &["loading", "stale", "fast"], NO_KEYS),
    spec("lastsave", 1, &["loading", "stale", "fast"], NO_KEYS),
    spec("bgsave", -1, &["admin", "noscript", "no_async_loading"], NO_KEYS),
    spec("bgrewriteaof", 1, &["admin", "noscript", "no_async_loading"], NO_KEYS),
    spec("acl", -2, &["admin", "noscript", "loading", "stale"], NO_KEYS),
    spec("keys", 2, &["readonly"], NO_KEYS),
    spec("scan", -2, &["readonly"], NO_KEYS),
    spec("randomkey", 1, &["readonly"], NO_KEYS),
    spec("slowlog", -2, &["admin", "loading", "stale"], NO_KEYS),
    spec("latency", -2, &["admin", "noscript", "loading", "stale"], NO_KEYS),
    spec("lolwut", -1, &["readonly", "fast"], NO_KEYS),
    spec("readonly", 1, &["loading", "stale", "fast"], NO_KEYS),
    spec("readwrite", 1, &["loading", "stale", "fast"], NO_KEYS),
    spec("cluster", -2, &["loading", "stale"], NO_KEYS),
    spec("asking", 1, &["fast"], NO_KEYS),
    spec("migrate", -6, &["write"], NO_KEYS),
    spec("sinter", -2, &["readonly"], ALL_KEYS),
    spec("sunion", -2, &["readonly"], ALL_KEYS),
    spec("sdiff", -2, &["readonly"], ALL_KEYS),
    spec("sintercard", -3, &["readonly"], NO_KEYS),
    spec("msetnx", -3, &["write", "denyoom"], (1, -1, 2)),
    // Typed commands, run by chorus_core::data (one RMW or one read of their key).
    spec("setex", 4, &["write", "denyoom"], ONE_KEY),
    spec("psetex", 4, &["write", "denyoom"], ONE_KEY),
    spec("getex", -2, &["write", "denyoom"], ONE_KEY),
    spec("getdel", 2, &["write", "denyoom"], ONE_KEY),
    spec("append", 3, &["write", "denyoom"], ONE_KEY),
    spec("strlen", 2, &["readonly"], ONE_KEY),
    spec("getrange", 4, &["readonly"], ONE_KEY),
    spec("substr", 4, &["readonly"], ONE_KEY),
    spec("setrange", 4, &["write", "denyoom"], ONE_KEY),
    spec("incrbyfloat", 3, &["write", "denyoom"], ONE_KEY),
    spec("setbit", 4, &["write", "denyoom"], ONE_KEY),
    spec("getbit", 3, &["readonly"], ONE_KEY),
    spec("bitcount", -2, &["readonly"], ONE_KEY),
    spec("bitpos", -3, &["readonly"], ONE_KEY),
    spec("bitfield", -2, &["write", "denyoom"], ONE_KEY),
    spec("bitfield_ro", -2, &["readonly", "fast"], ONE_KEY),
    spec("pfadd", -2, &["write", "denyoom", "fast"], ONE_KEY),
    spec("pfcount", -2, &["readonly"], ALL_KEYS),
    spec("pfmerge", -2, &["write", "denyoom"], ALL_KEYS),
    spec("expire", -3, &["write", "denyoom"], ONE_KEY),
    spec("pexpire", -3, &["write", "denyoom"], ONE_KEY),
    spec("expireat", -3, &["write", "denyoom"], ONE_KEY),
    spec("pexpireat", -3, &["write", "denyoom"], ONE_KEY),
    spec("persist", 2, &["write", "denyoom"], ONE_KEY),
    spec("ttl", 2, &["readonly"], ONE_KEY),
    spec("pttl", 2, &["readonly"], ONE_KEY),
    spec("expiretime", 2, &["readonly"], ONE_KEY),
    spec("pexpiretime", 2, &["readonly"], ONE_KEY),
    spec("type", 2, &["readonly"], ONE_KEY),
    spec("touch", 2, &["readonly"], ONE_KEY),
    spec("object", 3, &["readonly"], (2, 2, 1)),
    spec("memory", -2, &["readonly"], (2, 2, 1)),
    spec("dump", 2, &["readonly"], ONE_KEY),
    spec("restore", -4, &["write", "denyoom"], ONE_KEY),
    spec("role", 1, &["noscript", "loading", "stale", "fast"], NO_KEYS),
    spec("module", -2, &["admin", "noscript"], NO_KEYS),
    spec("hsetnx", 4, &["write", "denyoom"], ONE_KEY),
    spec("hexists", 3, &["readonly"], ONE_KEY),
    spec("hlen", 2, &["readonly"], ONE_KEY),
    spec("hkeys", 2, &["readonly"], ONE_KEY),
    spec("hvals", 2, &["readonly"], ONE_KEY),
    spec("hstrlen", 3, &["readonly"], ONE_KEY),
    spec("hincrby", 4, &["write", "denyoom"], ONE_KEY),
    spec("hincrbyfloat", 4, &["write", "denyoom"], ONE_KEY),
    spec("hrandfield", -2, &["readonly"], ONE_KEY),
    spec("hscan", -3, &["readonly"], ONE_KEY),
    spec("lpush", -3, &["write", "denyoom"], ONE_KEY),
    spec("rpush", -3, &["write", "denyoom"], ONE_KEY),
    spec("lpushx", -3, &["write", "denyoom"], ONE_KEY),
    spec("rpushx", -3, &["write", "denyoom"], ONE_KEY),
    spec("lpop", -2, &["write", "denyoom"], ONE_KEY),
    spec("rpop", -2, &["write", "denyoom"], ONE_KEY),
    spec("lrange", 4, &["readonly"], ONE_KEY),
    spec("llen", 2, &["readonly"], ONE_KEY),
    spec("lindex", 3, &["readonly"], ONE_KEY),
    spec("lset", 4, &["write", "denyoom"], ONE_KEY),
    spec("lrem", 4, &["write", "denyoom"], ONE_KEY),
    spec("ltrim", 4, &["write", "denyoom"], ONE_KEY),
    spec("linsert", 5, &["write", "denyoom"], ONE_KEY),
    spec("lpos", -3, &["readonly"], ONE_KEY),
    spec("sadd", -3, &["write", "denyoom"], ONE_KEY),
    spec("srem", -3, &["write", "denyoom"], ONE_KEY),
    spec("smembers", 2, &["readonly"], ONE_KEY),
    spec("sismember", 3, &["readonly"], ONE_KEY),
    spec("smismember", -3, &["readonly"], ONE_KEY),
    spec("scard", 2, &["readonly"], ONE_KEY),
    spec("spop", -2, &["write", "denyoom"], ONE_KEY),
    spec("srandmember", -2, &["readonly"], ONE_KEY),
    spec("sscan", -3, &["readonly"], ONE_KEY),
    spec("zadd", -4, &["write", "denyoom"], ONE_KEY),
    spec("zincrby", 4, &["write", "denyoom"], ONE_KEY),
    spec("zrem", -3, &["write", "denyoom"], ONE_KEY),
    spec("zscore", 3, &["readonly"], ONE_KEY),
    spec("zmscore", -3, &["readonly"], ONE_KEY),
    spec("zcard", 2, &["readonly"], ONE_KEY),
    spec("zcount", 4, &["readonly"], ONE_KEY),
    spec("zlexcount", 4, &["readonly"], ONE_KEY),
    spec("zrange", -4, &["readonly"], ONE_KEY),
    spec("zrangebyscore", -4, &["readonly"], ONE_KEY),
    spec("zrevrangebyscore", -4, &["readonly"], ONE_KEY),
    spec("zrangebylex", -4, &["readonly"], ONE_KEY),
    spec("zrevrangebylex", -4, &["readonly"], ONE_KEY),
    spec("zrevrange", -4, &["readonly"], ONE_KEY),
    spec("zrank", -3, &["readonly"], ONE_KEY),
    spec("zrevrank", -3, &["readonly"], ONE_KEY),
    spec("zpopmin", -2, &["write", "denyoom"], ONE_KEY),
    spec("zpopmax", -2, &["write", "denyoom"], ONE_KEY),
    spec("zremrangebyscore", 4, &["write", "denyoom"], ONE_KEY),
    spec("zremrangebyrank", 4, &["write", "denyoom"], ONE_KEY),
    spec("zremrangebylex", 4, &["write", "denyoom"], ONE_KEY),
    spec("zrandmember", -2, &["readonly"], ONE_KEY),
    spec("zscan", -3, &["readonly"], ONE_KEY),
    // Over several keys, per key linearizable, not atomic (connection/multikey.rs).
    spec("zunionstore", -4, &["write", "denyoom"], (1, 1, 1)),
    spec("zinterstore", -4, &["write", "denyoom"], (1, 1, 1)),
    spec("zdiffstore", -4, &["write", "denyoom"], (1, 1, 1)),
    spec("zunion", -3, &["readonly"], NO_KEYS),
    spec("zinter", -3, &["readonly"], NO_KEYS),
    spec("zdiff", -3, &["readonly"], NO_KEYS),
    spec("zintercard", -3, &["readonly"], NO_KEYS),
    spec("sinterstore", -3, &["write", "denyoom"], ALL_KEYS),
    spec("sunionstore", -3, &["write", "denyoom"], ALL_KEYS),
    spec("sdiffstore", -3, &["write", "denyoom"], ALL_KEYS),
    spec("rename", 3, &["write"], (1, 2, 1)),
    spec("renamenx", 3, &["write", "fast"], (1, 2, 1)),
    spec("copy", -3, &["write", "denyoom"], (1, 2, 1)),
    spec("lmove", 5, &["write", "denyoom"], (1, 2, 1)),
    spec("rpoplpush", 3, &["write", "denyoom"], (1, 2, 1)),
    spec("smove", 4, &["write", "fast"], (1, 2, 1)),
    spec("blpop", -3, &["write", "noscript"], (1, -2, 1)),
    spec("brpop", -3, &["write", "noscript"], (1, -2, 1)),
    spec("bzpopmin", -3, &["write", "noscript", "fast"], (1, -2, 1)),
    spec("bzpopmax", -3, &["write", "noscript", "fast"], (1, -2, 1)),
    spec("blmove", 6, &["write", "denyoom", "noscript"], (1, 2, 1)),
    spec("brpoplpush", 4, &["write", "denyoom", "noscript"], (1, 2, 1)),
    spec("blmpop", -5, &["write", "noscript"], NO_KEYS),
    spec("bzmpop", -5, &["write", "noscript"], NO_KEYS),
    spec("lmpop", -4, &["write"], NO_KEYS),
    spec("zmpop", -4, &["write"], NO_KEYS),
    spec("sort", -2, &["write", "denyoom"], ONE_KEY),
    spec("sort_ro", -2, &["readonly"], ONE_KEY),
    spec("bitop", -4, &["write", "denyoom"], (2, -1, 1)),
    spec("lcs", -3, &["readonly"], (1, 2, 1)),
    spec("geosearchstore", -8, &["write", "denyoom"], (1, 2, 1)),
    spec("zrangestore", -5, &["write", "denyoom"], (1, 2, 1)),
    spec("geoadd", -5, &["write", "denyoom"], ONE_KEY),
    spec("geopos", -2, &["readonly"], ONE_KEY),
    spec("geodist", -4, &["readonly"], ONE_KEY),
    spec("geohash", -2, &["readonly"], ONE_KEY),
    spec("geosearch", -7, &["readonly"], ONE_KEY),
    spec("georadius", -6, &["write", "denyoom"], ONE_KEY),
    spec("georadius_ro", -6, &["readonly"], ONE_KEY),
    spec("georadiusbymember", -5, &["write", "denyoom"], ONE_KEY),
    spec("georadiusbymember_ro", -5, &["readonly"], ONE_KEY),
    spec("xadd", -5, &["write", "denyoom", "fast"], ONE_KEY),
    spec("xlen", 2, &["readonly", "fast"], ONE_KEY),
    spec("xrange", -4, &["readonly"], ONE_KEY),
    spec("xrevrange", -4, &["readonly"], ONE_KEY),
    spec("xdel", -3, &["write", "fast"], ONE_KEY),
    spec("xtrim", -4, &["write"], ONE_KEY),
    spec("xsetid", -3, &["write", "denyoom", "fast"], ONE_KEY),
    spec("xread", -4, &["readonly", "blocking"], NO_KEYS),
    spec("xreadgroup", -7, &["write", "blocking"], NO_KEYS),
    spec("xgroup", -2, &["write"], NO_KEYS),
    spec("xack", -4, &["write", "fast"], ONE_KEY),
    spec("xpending", -3, &["readonly"], ONE_KEY),
    spec("xclaim", -6, &["write", "fast"], ONE_KEY),
    spec("xautoclaim", -6, &["write", "fast"], ONE_KEY),
    spec("xinfo", -2, &["readonly"], NO_KEYS),
    // Pub/Sub (crate::pubsub): no keys but the shard channels, which are routed by slot.
    spec("publish", 3, &["pubsub", "loading", "stale", "fast"], NO_KEYS),
    spec("spublish", 3, &["pubsub", "loading", "stale", "fast"], ONE_KEY),
    spec("subscribe", -2, &["pubsub", "noscript", "loading", "stale"], NO_KEYS),
    spec("psubscribe", -2, &["pubsub", "noscript", "loading", "stale"], NO_KEYS),
    spec("ssubscribe", -2, &["pubsub", "noscript", "loading", "stale"], ALL_KEYS),
    spec("unsubscribe", -1, &["pubsub", "noscript", "loading", "stale"], NO_KEYS),
    spec("punsubscribe", -1, &["pubsub", "noscript", "loading", "stale"], NO_KEYS),
    spec("sunsubscribe", -1, &["pubsub", "noscript", "loading", "stale"], ALL_KEYS),
    spec("pubsub", -2, &["pubsub", "loading", "stale"], NO_KEYS),
];

/// Every command name for metrics, plus `unknown` for everything else.
pub static COMMAND_NAMES: LazyLock<Vec<&'static str>> =
    LazyLock::new(|| COMMAND_TABLE.iter().map(|spec| spec.name).chain(["unknown"]).collect());

/// Index of `name` in [`COMMAND_NAMES`] (`unknown` if absent).
pub fn metric_index(name: &str) -> usize {
    COMMAND_TABLE.iter().position(|spec| spec.name == name).unwrap_or(COMMAND_TABLE.len())
}

/// Whether the command `name` (as [`parse`] names it) carries `flag` in the command table.
pub fn has_flag(name: &str, flag: &str) -> bool {
    COMMAND_TABLE.iter().any(|spec| spec.name == name && spec.flags.contains(&flag))
}

/// The keys a command names, by its key positions in the command table, plus the keys that
/// follow a `numkeys` argument or `STREAMS`. Cluster routing hashes them (cluster/map.rs);
/// arguments may be too few (routing runs before arity matters), so every index is checked.
pub fn command_keys(args: &[Bytes]) -> Vec<&Bytes> {
    let Some(first) = args.first() else { return Vec::new() };
    let lower = first.to_ascii_lowercase();
    let Some(spec) = COMMAND_TABLE.iter().find(|spec| spec.name.as_bytes() == lower.as_slice()) else {
        return Vec::new();
    };
    let mut keys = Vec::new();
    if spec.first_key > 0 {
        let last = if spec.last_key < 0 { args.len() as i64 + spec.last_key } else { spec.last_key };
        let indexes = (spec.first_key..=last).step_by(spec.step.max(1) as usize);
        keys.extend(indexes.filter_map(|index| args.get(index as usize)));
    }
    match spec.name {
        "zunion" | "zinter" | "zdiff" | "zintercard" | "sintercard" | "lmpop" | "zmpop" => {
            keys.extend(keys_after_numkeys(args, 1))
        }
        "blmpop" | "bzmpop" | "zunionstore" | "zinterstore" | "zdiffstore" => {
            keys.extend(keys_after_numkeys(args, 2))
        }
        "xread" | "xreadgroup" => {
            // STREAMS key [key ...] id [id ...]: the first half are keys.
            if let Some(at) = args.iter().position(|arg| arg.eq_ignore_ascii_case(b"STREAMS")) {
                let rest = &args[at + 1..];
                keys.extend(&rest[..rest.len() / 2]);
            }
        }
        _ => {}
    }
    keys
}

/// The keys counted by the `numkeys` argument at `index`.
fn keys_after_numkeys(args: &[Bytes], index: usize) -> &[Bytes] {
    let count = args.get(index).and_then(|arg| std::str::from_utf8(arg).ok()?.parse::<usize>().ok());
    let start = (index + 1).min(args.len());
    &args[start..(start + count.unwrap_or(0)).min(args.len())]
}

// -------------------------------------------------------------------- error vocabulary
//
// Replies that say whether a failed request may have taken effect (docs/resp.md, "Errors"):
// `-TRYAGAIN` certainly did not (retry, here later or at another replica), `-UNKNOWN` may
// have (a retry may apply it twice; read back before retrying).

/// `-TRYAGAIN <why>`: not executed.
pub fn try_again(why: impl std::fmt::Display) -> Reply {
    Reply::error(format!("TRYAGAIN {why}"))
}

/// `-UNKNOWN outcome unknown: <why>`: may or may not have taken effect.
pub fn outcome_unknown(why: impl std::fmt::Display) -> Reply {
    Reply::error(format!("UNKNOWN outcome unknown: {why}"))
}

/// `-OOM`, as Redis words it, for commands that may grow the data set past `maxmemory`.
pub fn out_of_memory() -> Reply {
    Reply::error("OOM command not allowed when used memory > 'maxmemory'.")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetCondition {
    Always,
    IfAbsent,
    IfPresent,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Ping(Option<Bytes>),
    Echo(Bytes),
    Hello {
        protover: Option<u8>,
        auth: Option<(Bytes, Bytes)>,
        setname: Option<Bytes>,
    },
    Auth {
        user: Option<Bytes>,
        password: Bytes,
    },
    Select(i64),
    Quit,
    /// Back to a fresh connection's state (RESP2, no name, out of MULTI, authenticated only
    /// if no password is set).
    Reset,
    Get(Bytes),
    Set {
        key: Bytes,
        value: Bytes,
        condition: SetCondition,
        get: bool,
    },
    SetNx {
        key: Bytes,
        value: Bytes,
    },
    GetSet {
        key: Bytes,
        value: Bytes,
    },
    Del(Vec<Bytes>),
    Exists(Vec<Bytes>),
    IncrBy {
        key: Bytes,
        delta: i64,
    },
    MGet(Vec<Bytes>),
    MSet(Vec<(Bytes, Bytes)>),
    /// HSET answers the number of new fields, HMSET answers OK.
    HSet {
        key: Bytes,
        pairs: Vec<(Bytes, Bytes)>,
        reply_ok: bool,
    },
    HDel {
        key: Bytes,
        fields: Vec<Bytes>,
    },
    DbSize,
    FlushAll,
    Info(Vec<String>),
    ConfigGet(Vec<Bytes>),
    ClientReply(ReplyMode),
    CommandCount,
    CommandList,
    CommandInfo(Vec<Bytes>),
    CommandDocs,
    ClientSetName(Bytes),
    ClientGetName,
    ClientSetInfo,
    ClientId,
    /// `WAIT numreplicas timeout`: `timeout_ms` 0 blocks until enough replicas hold the writes.
    Wait {
        replicas: usize,
        timeout_ms: u64,
    },
    /// `WAITAOF numlocal numreplicas timeout`: the connection's writes on disk here (after a
    /// sync, with `numlocal` > 0) and at `replicas` others (docs/resp.md, WAITAOF).
    WaitAof {
        local: bool,
        replicas: usize,
        timeout_ms: u64,
    },
    /// `SHUTDOWN [NOSAVE|SAVE] [NOW] [FORCE]`: stop this node gracefully (the options change
    /// nothing: durable state is always flushed, and leaving the view is always attempted).
    Shutdown,
    Cas {
        key: Bytes,
        expected: Bytes,
        new: Bytes,
    },
    /// Start queueing commands for EXEC (atomic across keys with protocol raftlog only).
    Multi,
    /// `SESSION client seq command...`: run a single-key command at most once for the
    /// client's session (raftlog, Cyclone §3.4): a retry with the same `client` and `seq`, at
    /// any replica, answers the saved outcome instead of running again.
    Session {
        client: u64,
        seq: u64,
        request: Box<Request>,
    },
    Exec,
    Discard,
    Watch(Vec<Bytes>),
    Unwatch,
    /// A typed command (lists, sets, sorted sets, expiry, the hash family, ...), run by
    /// `chorus_core::data` as one read or one RMW of its key. The arguments as sent.
    Data(Vec<Bytes>),
    /// A command about the server or this connection (TIME, ACL, SLOWLOG, CLIENT LIST, ...):
    /// answered by `crate::admin` without touching the data.
    Admin(Vec<Bytes>),
    /// BGSAVE, BGREWRITEAOF, LASTSAVE: the append-only file and snapshots
    /// (crate::persistence), answered by the event loop.
    Persistence(Vec<Bytes>),
    /// A command over many keys that reads this replica's key list or several keys (KEYS,
    /// SCAN, RANDOMKEY, SINTER, MSETNX, ...): per key linearizable at most.
    Keyspace(Vec<Bytes>),
    /// CLUSTER, READONLY, READWRITE (cluster/command.rs).
    Cluster(Vec<Bytes>),
    /// PUBLISH, SUBSCRIBE, PUBSUB, ... (crate::pubsub): no key, nothing replicated.
    PubSub(Vec<Bytes>),
}

/// CLIENT REPLY: whether the connection's replies are sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyMode {
    On,
    /// No reply at all, until CLIENT REPLY ON.
    Off,
    /// No reply to the next command.
    Skip,
}

impl Request {
    /// Allowed before AUTH when `requirepass` is set.
    pub fn allowed_unauthenticated(&self) -> bool {
        matches!(self, Request::Auth { .. } | Request::Hello { .. } | Request::Quit | Request::Reset)
    }
}

fn arity_error(name: &str) -> Reply {
    Reply::err(format!("wrong number of arguments for '{name}' command"))
}

fn syntax_error() -> Reply {
    Reply::err("syntax error")
}

fn not_integer() -> Reply {
    Reply::err("value is not an integer or out of range")
}

fn parse_i64(arg: &[u8]) -> Result<i64, Reply> {
    let value = chorus_core::command::parse_integer(Some(&Bytes::copy_from_slice(arg)));
    value.map_err(|_| not_integer())
}

/// Session ids clients choose live in their own half of the id space, apart from the ids
/// replicas use for their internal sessions.
pub const EXTERNAL_SESSION_BIT: u64 = 1 << 63;

fn parse_session(args: &[Bytes]) -> Result<Request, Reply> {
    let number = |arg: &[u8], what: &str| {
        std::str::from_utf8(arg)
            .ok()
            .and_then(|text| text.parse::<u64>().ok())
            .filter(|n| n & EXTERNAL_SESSION_BIT == 0)
            .ok_or_else(|| Reply::err(format!("SESSION {what} must be an integer from 0 to 2^63-1")))
    };
    let client = number(&args[1], "client id")? | EXTERNAL_SESSION_BIT;
    let seq = number(&args[2], "sequence number")?;
    // Checked before parsing the inner command: parsing it would recurse once per nested
    // SESSION, and 200,000 of them in one frame would overflow the stack.
    if args[3].eq_ignore_ascii_case(b"session") {
        return Err(Reply::err("SESSION cannot be nested"));
    }
    let (_, inner) = parse(&args[3..]);
    let request = inner?;
    if single_key_command(&request).is_none() {
        return Err(Reply::err("SESSION runs single-key commands (GET, SET, INCR, HSET, ...) only"));
    }
    Ok(Request::Session { client, seq, request: Box::new(request) })
}

fn printable(arg: &[u8]) -> String {
    let text = String::from_utf8_lossy(&arg[..arg.len().min(128)]);
    text.chars().map(|c| if c.is_control() || c == '\'' { '?' } else { c }).collect()
}

/// Parse one command. `Err` is the reply to send instead (unknown command, arity, syntax).
/// The result also names the command for metrics.
pub fn parse(args: &[Bytes]) -> (&'static str, Result<Request, Reply>) {
    let Some(first) = args.first() else { return ("unknown", Err(syntax_error())) };
    // Compared in place: a lower-cased copy was an allocation per command (issue 23).
    let Some(spec) = COMMAND_TABLE.iter().find(|spec| spec.name.as_bytes().eq_ignore_ascii_case(first))
    else {
        return ("unknown", Err(Reply::err(format!("unknown command '{}'", printable(first)))));
    };
    let arity_ok =
        if spec.arity >= 0 { args.len() as i64 == spec.arity } else { args.len() as i64 >= -spec.arity };
    if !arity_ok {
        return (spec.name, Err(arity_error(spec.name)));
    }
    (spec.name, parse_known(spec.name, args))
}

fn upper(arg: &[u8]) -> Vec<u8> {
    arg.to_ascii_uppercase()
}

fn parse_known(name: &'static str, args: &[Bytes]) -> Result<Request, Reply> {
    let arg = |i: usize| args[i].clone();
    let rest = || args[1..].to_vec();
    Ok(match name {
        "ping" => match args.len() {
            1 => Request::Ping(None),
            2 => Request::Ping(Some(arg(1))),
            _ => return Err(arity_error(name)),
        },
        "echo" => Request::Echo(arg(1)),
        "hello" => parse_hello(args)?,
        "auth" => match args.len() {
            2 => Request::Auth { user: None, password: arg(1) },
            3 => Request::Auth { user: Some(arg(1)), password: arg(2) },
            _ => return Err(syntax_error()),
        },
        "select" => Request::Select(parse_i64(&args[1])?),
        "quit" => Request::Quit,
        "reset" => Request::Reset,
        "get" => Request::Get(arg(1)),
        "set" => parse_set(args)?,
        "setnx" => Request::SetNx { key: arg(1), value: arg(2) },
        "getset" => Request::GetSet { key: arg(1), value: arg(2) },
        "del" | "unlink" => Request::Del(rest()),
        "exists" => Request::Exists(rest()),
        "incr" => Request::IncrBy { key: arg(1), delta: 1 },
        "decr" => Request::IncrBy { key: arg(1), delta: -1 },
        "incrby" => Request::IncrBy { key: arg(1), delta: parse_i64(&args[2])? },
        "decrby" => {
            let delta = parse_i64(&args[2])?;
            let delta = delta.checked_neg().ok_or_else(|| Reply::err("decrement would overflow"))?;
            Request::IncrBy { key: arg(1), delta }
        }
        "mget" => Request::MGet(rest()),
        "mset" => {
            if args.len() & 1 != 1 {
                return Err(arity_error(name));
            }
            Request::MSet(args[1..].chunks(2).map(|pair| (pair[0].clone(), pair[1].clone())).collect())
        }
        "hset" | "hmset" => {
            if args.len() & 1 != 0 {
                return Err(arity_error(name));
            }
            let pairs = args[2..].chunks(2).map(|pair| (pair[0].clone(), pair[1].clone())).collect();
            Request::HSet { key: arg(1), pairs, reply_ok: name == "hmset" }
        }
        "hdel" => Request::HDel { key: arg(1), fields: args[2..].to_vec() },
        "dbsize" => Request::DbSize,
        "flushall" | "flushdb" => match args.get(1).map(|a| upper(a)) {
            None => Request::FlushAll,
            Some(mode) if mode == b"SYNC" || mode == b"ASYNC" => Request::FlushAll,
            Some(_) => return Err(syntax_error()),
        },
        "info" => {
            Request::Info(args[1..].iter().map(|a| String::from_utf8_lossy(a).to_ascii_lowercase()).collect())
        }
        "config" => match upper(&args[1]).as_slice() {
            b"GET" if args.len() >= 3 => Request::ConfigGet(args[2..].to_vec()),
            b"GET" => return Err(arity_error("config|get")),
            b"SET" | b"RESETSTAT" | b"REWRITE" => Request::Admin(args.to_vec()),
            _ => {
                return Err(Reply::err(format!(
                    "unknown subcommand '{}'. Try CONFIG GET.",
                    printable(&args[1])
                )))
            }
        },
        "command" => match args.get(1).map(|a| upper(a)).as_deref() {
            None => Request::CommandList,
            Some(b"COUNT") => Request::CommandCount,
            Some(b"DOCS") => Request::CommandDocs,
            Some(b"INFO") => Request::CommandInfo(args[2..].to_vec()),
            Some(b"LIST") => Request::CommandList,
            Some(_) => {
                return Err(Reply::err(format!(
                    "unknown subcommand '{}'. Try COMMAND DOCS.",
                    printable(&args[1])
                )))
            }
        },
        "client" => match (upper(&args[1]).as_slice(), args.len()) {
            (b"SETNAME", 3) => Request::ClientSetName(arg(2)),
            (b"GETNAME", 2) => Request::ClientGetName,
            (b"SETINFO", 4) => Request::ClientSetInfo,
            (b"ID", 2) => Request::ClientId,
            (b"SETNAME" | b"GETNAME" | b"SETINFO" | b"ID", _) => return Err(arity_error("client")),
            (b"REPLY", 3) => match upper(&args[2]).as_slice() {
                b"ON" => Request::ClientReply(ReplyMode::On),
                b"OFF" => Request::ClientReply(ReplyMode::Off),
                b"SKIP" => Request::ClientReply(ReplyMode::Skip),
                _ => return Err(syntax_error()),
            },
            (b"REPLY", _) => return Err(arity_error("client|reply")),
            (
                b"LIST" | b"INFO" | b"KILL" | b"NO-EVICT" | b"NO-TOUCH" | b"PAUSE" | b"UNPAUSE"
                | b"TRACKINGINFO" | b"GETREDIR" | b"UNBLOCK" | b"TRACKING" | b"CACHING",
                _,
            ) => Request::Admin(args.to_vec()),
            _ => {
                return Err(Reply::err(format!(
                    "unknown subcommand '{}'. Try CLIENT SETNAME.",
                    printable(&args[1])
                )))
            }
        },
        "wait" => {
            let replicas = parse_i64(&args[1])?;
            let timeout = parse_i64(&args[2])?;
            if replicas < 0 || timeout < 0 {
                return Err(Reply::err("timeout is negative"));
            }
            Request::Wait { replicas: replicas as usize, timeout_ms: timeout as u64 }
        }
        "waitaof" => {
            let (local, replicas, timeout) =
                (parse_i64(&args[1])?, parse_i64(&args[2])?, parse_i64(&args[3])?);
            if local < 0 || replicas < 0 {
                return Err(Reply::err("value is out of range, must be positive"));
            }
            if timeout < 0 {
                return Err(Reply::err("timeout is negative"));
            }
            Request::WaitAof { local: local > 0, replicas: replicas as usize, timeout_ms: timeout as u64 }
        }
        "cas" => Request::Cas { key: arg(1), expected: arg(2), new: arg(3) },
        "session" => parse_session(args)?,
        "multi" => Request::Multi,
        "exec" => Request::Exec,
        "discard" => Request::Discard,
        "watch" => Request::Watch(args[1..].to_vec()),
        "unwatch" => Request::Unwatch,
        "shutdown" => {
            for option in &args[1..] {
                match upper(option).as_slice() {
                    b"NOSAVE" | b"SAVE" | b"NOW" | b"FORCE" => {}
                    b"ABORT" => {
                        return Err(Reply::err(
                            "SHUTDOWN ABORT is not supported: no shutdown is ever pending",
                        ))
                    }
                    _ => return Err(syntax_error()),
                }
            }
            Request::Shutdown
        }
        // MEMORY USAGE reads a key; STATS, DOCTOR, ... are about the server.
        "memory" if upper(&args[1]) == b"USAGE" && args.len() >= 3 => Request::Data(args.to_vec()),
        "memory" => Request::Admin(args.to_vec()),
        "bgsave" | "bgrewriteaof" | "lastsave" => Request::Persistence(args.to_vec()),
        "time" | "acl" | "slowlog" | "latency" | "lolwut" | "role" | "module" => {
            Request::Admin(args.to_vec())
        }
        "cluster" | "readonly" | "readwrite" | "asking" | "migrate" => Request::Cluster(args.to_vec()),
        _ if crate::pubsub::COMMANDS.contains(&name) => Request::PubSub(args.to_vec()),
        "keys" | "scan" | "randomkey" | "sinter" | "sunion" | "sdiff" | "sintercard" | "msetnx" => {
            Request::Keyspace(args.to_vec())
        }
        _ if crate::connection::MULTIKEY_COMMANDS.contains(&name) => Request::Keyspace(args.to_vec()),
        // PFCOUNT of several keys counts their union (connection/multikey.rs).
        "pfcount" if args.len() > 2 => Request::Keyspace(args.to_vec()),
        // With STORE/STOREDIST, GEORADIUS writes a second key.
        "georadius" | "georadiusbymember"
            if args
                .iter()
                .any(|arg| arg.eq_ignore_ascii_case(b"STORE") || arg.eq_ignore_ascii_case(b"STOREDIST")) =>
        {
            Request::Keyspace(args.to_vec())
        }
        _ if chorus_core::data::access(name).is_some() => Request::Data(args.to_vec()),
        _ => return Err(Reply::err(format!("unknown command '{name}'"))),
    })
}

fn parse_hello(args: &[Bytes]) -> Result<Request, Reply> {
    let mut request = Request::Hello { protover: None, auth: None, setname: None };
    let Request::Hello { protover, auth, setname } = &mut request else { unreachable!() };
    let Some(version) = args.get(1) else { return Ok(request) };
    let version =
        parse_i64(version).map_err(|_| Reply::err("Protocol version is not an integer or out of range"))?;
    if version != 2 && version != 3 {
        return Err(Reply::error("NOPROTO unsupported protocol version"));
    }
    *protover = Some(version as u8);
    let mut i = 2;
    while i < args.len() {
        match upper(&args[i]).as_slice() {
            b"AUTH" if i + 2 < args.len() => {
                *auth = Some((args[i + 1].clone(), args[i + 2].clone()));
                i += 3;
            }
            b"SETNAME" if i + 1 < args.len() => {
                *setname = Some(args[i + 1].clone());
                i += 2;
            }
            _ => return Err(Reply::err(format!("Syntax error in HELLO option '{}'", printable(&args[i])))),
        }
    }
    Ok(request)
}

fn parse_set(args: &[Bytes]) -> Result<Request, Reply> {
    let mut condition = SetCondition::Always;
    let mut get = false;
    let mut i = 3;
    while i < args.len() {
        match upper(&args[i]).as_slice() {
            b"NX" if condition == SetCondition::Always => condition = SetCondition::IfAbsent,
            b"XX" if condition == SetCondition::Always => condition = SetCondition::IfPresent,
            b"GET" => get = true,
            // Expiry, and XX with GET, are typed commands (chorus_core::data).
            b"KEEPTTL" | b"EX" | b"PX" | b"EXAT" | b"PXAT" => return Ok(Request::Data(args.to_vec())),
            _ => return Err(syntax_error()),
        }
        i += 1;
    }
    if get && condition == SetCondition::IfPresent {
        return Ok(Request::Data(args.to_vec()));
    }
    Ok(Request::Set { key: args[1].clone(), value: args[2].clone(), condition, get })
}

// ------------------------------------------------------------------------------ mapping

/// Strings may not look like typed values (see `chorus_core::data::value`).
pub fn check_string_value(value: &[u8]) -> Result<(), Reply> {
    if data::is_reserved(value) {
        return Err(Reply::err("value starts with a prefix chorus reserves for typed values"));
    }
    Ok(())
}

/// The wall clock in ms since the Unix epoch: what key expiry deadlines are measured in.
pub fn wall_clock_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A typed command as the RMW that runs it at `now_ms`, bounded by `bytes_max`.
pub fn exec_command(args: Vec<Bytes>, now_ms: u64, bytes_max: usize) -> Command {
    let key = data::key_of(&args).clone();
    let bytes_max = u32::try_from(bytes_max).unwrap_or(u32::MAX);
    Command::Rmw { key, op: RmwOp::Exec(ExecOp { now_ms, bytes_max, args }) }
}

/// A string or hash request as the typed command that does the same, for keys whose value
/// only `chorus_core::data` understands (a deadline, a list, ...). `None` for CAS.
pub fn as_typed(request: &Request) -> Option<Vec<Bytes>> {
    let words = |words: &[&[u8]]| words.iter().map(|w| Bytes::copy_from_slice(w)).collect::<Vec<_>>();
    Some(match request {
        Request::Get(key) => words(&[b"GET", key]),
        Request::Set { key, value, condition, get } => {
            let mut args = words(&[b"SET", key, value]);
            match condition {
                SetCondition::Always => {}
                SetCondition::IfAbsent => args.push(Bytes::from_static(b"NX")),
                SetCondition::IfPresent => args.push(Bytes::from_static(b"XX")),
            }
            if *get {
                args.push(Bytes::from_static(b"GET"));
            }
            args
        }
        Request::SetNx { key, value } => words(&[b"SETNX", key, value]),
        Request::GetSet { key, value } => words(&[b"GETSET", key, value]),
        Request::IncrBy { key, delta } => words(&[b"INCRBY", key, delta.to_string().as_bytes()]),
        Request::HSet { key, pairs, reply_ok } => {
            let mut args = words(&[if *reply_ok { b"HMSET" } else { b"HSET" }, key]);
            for (field, value) in pairs {
                args.extend([field.clone(), value.clone()]);
            }
            args
        }
        Request::HDel { key, fields } => {
            let mut args = words(&[b"HDEL", key]);
            args.extend(fields.iter().cloned());
            args
        }
        Request::Data(args) => args.clone(),
        _ => return None,
    })
}

/// Whether a plain read found a value only `chorus_core::data` can interpret, or a string
/// RMW refused one: the request is then re-run as a typed command.
pub fn needs_typed(outcome: &Outcome) -> bool {
    match outcome {
        Outcome::Value(Some(value)) => data::is_reserved(value) && !hash::is_hash(value),
        Outcome::Error(CommandError::Typed) => true,
        _ => false,
    }
}

/// The reply for a typed command's outcome.
pub fn data_reply(outcome: Outcome) -> Reply {
    match outcome {
        Outcome::Data(data) => reply_of(data),
        Outcome::Error(error) => error_reply(&error),
        other => Reply::err(format!("internal error: a typed command answered {other:?}")),
    }
}

fn reply_of(data: Data) -> Reply {
    match data {
        Data::Nil => Reply::Null,
        Data::NilArray => Reply::NullArray,
        Data::Integer(value) => Reply::Integer(value),
        Data::Bulk(bytes) => Reply::Bulk(bytes),
        Data::Status(text) => {
            const STATUSES: &[&str] = &["OK", "none", "string", "list", "set", "zset", "hash", "stream"];
            match STATUSES.iter().find(|status| **status == text) {
                Some(status) => Reply::Status(status),
                None => Reply::Bulk(Bytes::from(text)),
            }
        }
        Data::Array(items) => Reply::Array(items.into_iter().map(reply_of).collect()),
        Data::Map(pairs) => Reply::Map(pairs.into_iter().map(|(k, v)| (reply_of(k), reply_of(v))).collect()),
        Data::Error(line) => Reply::Error(line),
    }
}

/// How the reply to a single-key command is built from its outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyShape {
    /// GET: the value, nil, or WRONGTYPE for a hash.
    Value,
    /// SET: OK.
    Ok,
    /// SET NX / SET XX: OK or nil.
    OkOrNil,
    /// SET NX GET: the previous value from a compare-and-swap.
    CasPrevious,
    /// GETSET / SET GET: the previous value of a swap.
    Previous,
    /// SETNX: 1 or 0.
    Flag,
    /// INCRBY and friends.
    Integer,
    /// CAS: `[1|0, previous]`.
    Cas,
    /// A typed command: the reply it computed.
    Data,
}

/// The command a transaction or a session queues for `request`: a single-key command, or a
/// typed command run as an RMW at `now_ms` (in a transaction even reads run as RMWs).
pub fn queued_command(
    request: &Request,
    now_ms: u64,
    bytes_max: usize,
) -> Option<Result<(Command, ReplyShape), Reply>> {
    match request {
        Request::Data(args) => Some(Ok((exec_command(args.clone(), now_ms, bytes_max), ReplyShape::Data))),
        request => single_key_command(request),
    }
}

/// The core command for a single-key request, and how to shape its reply. `None` for requests
/// that are not one single-key command. `Err` for values the store refuses.
pub fn single_key_command(request: &Request) -> Option<Result<(Command, ReplyShape), Reply>> {
    let rmw = |key: &Bytes, op: RmwOp| Command::Rmw { key: key.clone(), op };
    let checked = |value: &Bytes, plan: (Command, ReplyShape)| check_string_value(value).map(|()| plan);
    Some(match request {
        Request::Get(key) => Ok((Command::Read { key: key.clone() }, ReplyShape::Value)),
        Request::Set { key, value, condition, get } => {
            let plan = match (condition, get) {
                (SetCondition::Always, false) => {
                    (Command::Write { key: key.clone(), value: Some(value.clone()) }, ReplyShape::Ok)
                }
                (SetCondition::Always, true) => {
                    (rmw(key, RmwOp::Swap(Some(value.clone()))), ReplyShape::Previous)
                }
                (SetCondition::IfAbsent, false) => {
                    (rmw(key, RmwOp::SetIfAbsent(value.clone())), ReplyShape::OkOrNil)
                }
                (SetCondition::IfAbsent, true) => (
                    rmw(key, RmwOp::CompareAndSwap { expected: None, new: Some(value.clone()) }),
                    ReplyShape::CasPrevious,
                ),
                (SetCondition::IfPresent, _) => {
                    (rmw(key, RmwOp::SetIfPresent(value.clone())), ReplyShape::OkOrNil)
                }
            };
            checked(value, plan)
        }
        Request::SetNx { key, value } => {
            checked(value, (rmw(key, RmwOp::SetIfAbsent(value.clone())), ReplyShape::Flag))
        }
        Request::GetSet { key, value } => {
            checked(value, (rmw(key, RmwOp::Swap(Some(value.clone()))), ReplyShape::Previous))
        }
        Request::IncrBy { key, delta } => Ok((rmw(key, RmwOp::IncrementBy(*delta)), ReplyShape::Integer)),
        Request::Cas { key, expected, new } => checked(
            new,
            (
                rmw(key, RmwOp::CompareAndSwap { expected: Some(expected.clone()), new: Some(new.clone()) }),
                ReplyShape::Cas,
            ),
        ),
        _ => return None,
    })
}

const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

/// A string value for a reply: hashes are the wrong type.
fn string_reply(value: Option<Bytes>) -> Reply {
    match value {
        Some(value) if hash::is_hash(&value) => Reply::error(WRONGTYPE),
        value => Reply::optional(value),
    }
}

/// The reply for a failed command.
pub fn error_reply(error: &CommandError) -> Reply {
    match error {
        CommandError::NotInteger => not_integer(),
        CommandError::Overflow => Reply::err("increment or decrement would overflow"),
        CommandError::Unavailable(why) => try_again(format!("replica is not serving: {why}")),
        CommandError::StaleSequence => {
            Reply::err("stale sequence number: this client session already executed a newer request")
        }
        CommandError::Locked => Reply::err("key is locked by a transaction in progress; retry"),
        CommandError::OutcomeUnknown => outcome_unknown(
            "the update did not complete here (the replica left the view, is stopping, or the request \
             deadline passed); it may have taken effect",
        ),
        CommandError::WrongType | CommandError::Typed => Reply::error(WRONGTYPE),
        CommandError::HashCorrupt => Reply::err("stored hash is corrupt"),
        CommandError::ValueTooLarge => Reply::err("the value would exceed the size limit"),
    }
}

/// Build the reply for `outcome` in the requested shape.
pub fn shape_reply(shape: ReplyShape, outcome: Outcome) -> Reply {
    match (shape, outcome) {
        (_, Outcome::Error(error)) => error_reply(&error),
        (ReplyShape::Data, outcome) => data_reply(outcome),
        (ReplyShape::Value, Outcome::Value(value)) => string_reply(value),
        (ReplyShape::Ok, Outcome::Written) => Reply::ok(),
        (ReplyShape::OkOrNil, Outcome::Flag(true)) => Reply::ok(),
        (ReplyShape::OkOrNil, Outcome::Flag(false)) => Reply::Null,
        (ReplyShape::CasPrevious, Outcome::Cas { previous, .. }) => string_reply(previous),
        (ReplyShape::Previous, Outcome::Value(Some(previous))) if hash::is_hash(&previous) => {
            Reply::err("the key held a hash; it was replaced by the new string")
        }
        (ReplyShape::Previous, Outcome::Value(previous)) => Reply::optional(previous),
        (ReplyShape::Flag, Outcome::Flag(flag)) => Reply::Integer(flag as i64),
        (ReplyShape::Integer, Outcome::Integer(value)) => Reply::Integer(value),
        (ReplyShape::Cas, Outcome::Cas { swapped, previous }) => {
            Reply::Array(vec![Reply::Integer(swapped as i64), Reply::optional(previous)])
        }
        (shape, outcome) => Reply::err(format!("internal error: {shape:?} cannot answer {outcome:?}")),
    }
}

/// Redis-style glob match (`*`, `?`, `[...]` without ranges), ASCII case-insensitive, for
/// CONFIG GET patterns.
pub fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let (mut star, mut star_t) = (None, 0);
    while t < text.len() {
        if p < pattern.len() && (pattern[p] == b'?' || pattern[p].eq_ignore_ascii_case(&text[t])) {
            p += 1;
            t += 1;
        } else if p < pattern.len() && pattern[p] == b'*' {
            star = Some(p);
            star_t = t;
            p += 1;
        } else if let Some(s) = star {
            p = s + 1;
            star_t += 1;
            t = star_t;
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|c| *c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<Bytes> {
        line.split(' ').map(|w| Bytes::copy_from_slice(w.as_bytes())).collect()
    }

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn request(line: &str) -> Result<Request, Reply> {
        parse(&args(line)).1
    }

    fn plan(line: &str) -> (Command, ReplyShape) {
        single_key_command(&request(line).unwrap()).unwrap().unwrap()
    }

    fn rmw(key: &str, op: RmwOp) -> Command {
        Command::Rmw { key: b(key), op }
    }

    #[test]
    fn string_commands_map_onto_core_commands() {
        assert_eq!(plan("GET k"), (Command::Read { key: b("k") }, ReplyShape::Value));
        assert_eq!(plan("set k v"), (Command::Write { key: b("k"), value: Some(b("v")) }, ReplyShape::Ok));
        assert_eq!(plan("SET k v NX"), (rmw("k", RmwOp::SetIfAbsent(b("v"))), ReplyShape::OkOrNil));
        assert_eq!(plan("SET k v XX"), (rmw("k", RmwOp::SetIfPresent(b("v"))), ReplyShape::OkOrNil));
        assert_eq!(plan("SET k v GET"), (rmw("k", RmwOp::Swap(Some(b("v")))), ReplyShape::Previous));
        assert_eq!(
            plan("SET k v NX GET"),
            (rmw("k", RmwOp::CompareAndSwap { expected: None, new: Some(b("v")) }), ReplyShape::CasPrevious)
        );
        assert_eq!(plan("SETNX k v"), (rmw("k", RmwOp::SetIfAbsent(b("v"))), ReplyShape::Flag));
        assert_eq!(plan("GETSET k v"), (rmw("k", RmwOp::Swap(Some(b("v")))), ReplyShape::Previous));
        assert_eq!(plan("INCR k"), (rmw("k", RmwOp::IncrementBy(1)), ReplyShape::Integer));
        assert_eq!(plan("DECR k"), (rmw("k", RmwOp::IncrementBy(-1)), ReplyShape::Integer));
        assert_eq!(plan("INCRBY k -5"), (rmw("k", RmwOp::IncrementBy(-5)), ReplyShape::Integer));
        assert_eq!(plan("DECRBY k 7"), (rmw("k", RmwOp::IncrementBy(-7)), ReplyShape::Integer));
        assert_eq!(
            plan("CAS k a b"),
            (rmw("k", RmwOp::CompareAndSwap { expected: Some(b("a")), new: Some(b("b")) }), ReplyShape::Cas)
        );
        assert_eq!(single_key_command(&Request::MGet(vec![b("a")])), None);
    }

    #[test]
    fn argument_errors_are_replies() {
        assert_eq!(request("GET"), Err(Reply::err("wrong number of arguments for 'get' command")));
        assert_eq!(request("GET a b"), Err(Reply::err("wrong number of arguments for 'get' command")));
        assert_eq!(request("INCRBY k x"), Err(Reply::err("value is not an integer or out of range")));
        assert_eq!(request("INCRBY k 01"), Err(Reply::err("value is not an integer or out of range")));
        assert!(request(&format!("DECRBY k {}", i64::MIN)).is_err());
        assert_eq!(request("SET k v NX XX"), Err(Reply::err("syntax error")));
        assert_eq!(request("SET k v EX 10"), Ok(Request::Data(args("SET k v EX 10"))));
        assert_eq!(request("ZADD z 1 m"), Ok(Request::Data(args("ZADD z 1 m"))));
        assert_eq!(request("TIME"), Ok(Request::Admin(args("TIME"))));
        assert_eq!(request("SCAN 0"), Ok(Request::Keyspace(args("SCAN 0"))));
        assert!(request("MSET a 1 b").is_err());
        assert!(request("HSET h f").is_err());
        assert!(request("HSET h f v g").is_err());
        assert_eq!(request("HELLO 4"), Err(Reply::error("NOPROTO unsupported protocol version")));
        assert_eq!(request("FROB x"), Err(Reply::err("unknown command 'FROB'")));
        assert_eq!(parse(&args("FROB x")).0, "unknown");
        assert_eq!(parse(&args("get x")).0, "get");
    }

    #[test]
    fn admin_commands_parse() {
        assert_eq!(request("PING"), Ok(Request::Ping(None)));
        assert_eq!(request("config get save"), Ok(Request::ConfigGet(vec![b("save")])));
        assert_eq!(request("COMMAND DOCS"), Ok(Request::CommandDocs));
        assert_eq!(request("CLIENT SETINFO lib-name redis-py"), Ok(Request::ClientSetInfo));
        assert_eq!(request("WAIT 2 0"), Ok(Request::Wait { replicas: 2, timeout_ms: 0 }));
        assert_eq!(
            request("WAITAOF 1 2 0"),
            Ok(Request::WaitAof { local: true, replicas: 2, timeout_ms: 0 })
        );
        assert!(request("WAITAOF -1 2 0").is_err());
        assert_eq!(request("SHUTDOWN NOSAVE"), Ok(Request::Shutdown));
        assert!(request("SHUTDOWN ABORT").is_err());
        assert_eq!(
            request("HELLO 3 AUTH default pw SETNAME me"),
            Ok(Request::Hello {
                protover: Some(3),
                auth: Some((b("default"), b("pw"))),
                setname: Some(b("me"))
            })
        );
        assert_eq!(request("FLUSHALL ASYNC"), Ok(Request::FlushAll));
        assert_eq!(
            request("HMSET h a 1 b 2"),
            Ok(Request::HSet {
                key: b("h"),
                pairs: vec![(b("a"), b("1")), (b("b"), b("2"))],
                reply_ok: true
            })
        );
    }

    #[test]
    fn outcomes_shape_replies() {
        assert_eq!(shape_reply(ReplyShape::Value, Outcome::Value(None)), Reply::Null);
        assert_eq!(shape_reply(ReplyShape::Value, Outcome::Value(Some(b("v")))), Reply::bulk(b("v")));
        let hash = hash::encode(&vec![(b("f"), b("v"))]);
        assert!(shape_reply(ReplyShape::Value, Outcome::Value(hash)).is_error());
        assert_eq!(shape_reply(ReplyShape::OkOrNil, Outcome::Flag(false)), Reply::Null);
        assert_eq!(shape_reply(ReplyShape::Flag, Outcome::Flag(true)), Reply::Integer(1));
        assert_eq!(
            shape_reply(ReplyShape::Cas, Outcome::Cas { swapped: false, previous: Some(b("x")) }),
            Reply::Array(vec![Reply::Integer(0), Reply::bulk(b("x"))])
        );
        assert_eq!(
            shape_reply(ReplyShape::Integer, Outcome::Error(CommandError::NotInteger)),
            Reply::err("value is not an integer or out of range")
        );
        let unknown = shape_reply(ReplyShape::Ok, Outcome::Error(CommandError::OutcomeUnknown));
        assert!(
            matches!(&unknown, Reply::Error(text) if text.starts_with("UNKNOWN outcome unknown: ")),
            "{unknown:?}"
        );
        let refused =
            shape_reply(ReplyShape::Ok, Outcome::Error(CommandError::Unavailable("not in the current view")));
        assert_eq!(refused, Reply::error("TRYAGAIN replica is not serving: not in the current view"));
        assert!(has_flag("set", "denyoom") && !has_flag("del", "denyoom") && has_flag("get", "readonly"));
    }

    #[test]
    fn strings_that_look_like_hashes_are_refused() {
        let mut value = hash::MAGIC.to_vec();
        value.extend_from_slice(b"x");
        let request = Request::Set {
            key: b("k"),
            value: Bytes::from(value),
            condition: SetCondition::Always,
            get: false,
        };
        assert!(single_key_command(&request).unwrap().is_err());
    }

    #[test]
    fn nested_sessions_are_refused_without_recursing() {
        let mut line = "SESSION 1 1 ".repeat(200_000);
        line.push_str("GET k");
        assert_eq!(request(&line), Err(Reply::err("SESSION cannot be nested")));
        assert!(matches!(request("SESSION 1 1 GET k"), Ok(Request::Session { seq: 1, .. })));
    }

    #[test]
    fn glob_patterns() {
        assert!(glob_match(b"*", b"save"));
        assert!(glob_match(b"sa?e", b"SAVE"));
        assert!(glob_match(b"max*", b"maxmemory"));
        assert!(!glob_match(b"max*", b"save"));
        assert!(glob_match(b"*memory*", b"maxmemory-policy"));
    }
}
