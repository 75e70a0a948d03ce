//! Settings a client may change while the node runs: `CONFIG SET` and `ACL SETUSER default`
//! (docs/resp.md, "Run-time settings"). Everything else is read from the configuration file
//! at start. Each value is an atomic that the code using it reads when it needs it, so a
//! change applies to every connection from its next command; the default user's passwords
//! sit behind a lock taken only by AUTH, HELLO, a new connection and ACL commands.
//!
//! Changes are this node's alone and last until it stops, as in Redis without CONFIG
//! REWRITE: set them on every node, and in the configuration file to keep them.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};

use chorus_net::handshake::constant_time_eq;
use sha2::{Digest, Sha256};

use crate::config::ClientLimits;
use crate::pubsub::{Limit, OutputLimits};

/// The one user, `default`: Redis' `requirepass` is this user with one password.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DefaultUser {
    /// `off`: nobody can authenticate, and new connections start unauthenticated.
    pub enabled: bool,
    /// `nopass`: any password (and none) authenticates.
    pub nopass: bool,
    /// SHA-256 of each password (Redis keeps hashes too; ACL LIST shows them).
    pub passwords: Vec<[u8; 32]>,
}

impl DefaultUser {
    pub fn with_password(requirepass: Option<&str>) -> DefaultUser {
        match requirepass {
            Some(password) => {
                DefaultUser { enabled: true, nopass: false, passwords: vec![digest(password.as_bytes())] }
            }
            None => DefaultUser { enabled: true, nopass: true, passwords: Vec::new() },
        }
    }

    /// A new connection is authenticated without AUTH.
    pub fn open(&self) -> bool {
        self.enabled && self.nopass
    }

    /// `password` authenticates. Every stored hash is compared, in constant time, so the
    /// answer's timing says nothing about which password came close.
    pub fn accepts(&self, password: &[u8]) -> bool {
        let offered = digest(password);
        let matched =
            self.passwords.iter().fold(false, |matched, stored| matched | constant_time_eq(stored, &offered));
        self.enabled && (self.nopass || matched)
    }
}

pub fn digest(password: &[u8]) -> [u8; 32] {
    Sha256::digest(password).into()
}

pub struct Live {
    user: RwLock<DefaultUser>,
    /// The client port is reachable from other hosts and `protected-mode` is on: the
    /// default user must keep a password (the node refused to start without one).
    password_required: bool,
    pub maxmemory_bytes: AtomicU64,
    pub idle_timeout_s: AtomicU64,
    pub maxclients: AtomicU64,
    /// What the open-file limit leaves room for, next to peer links and files.
    maxclients_max: u64,
    pub query_buffer_bytes_max: AtomicU64,
    /// Redis' `slowlog-log-slower-than`, microseconds; negative: off, 0: every command.
    pub slowlog_slower_than_us: AtomicI64,
    pub slowlog_len_max: AtomicU64,
    /// Redis' `latency-monitor-threshold`, milliseconds (0: off).
    pub latency_threshold_ms: AtomicU64,
    /// `client-output-buffer-limit`'s pubsub class, which the Pub/Sub hub enforces.
    pub pubsub_limits: Arc<OutputLimits>,
}

/// What CONFIG SET accepts (and CONFIG GET shows from here).
pub const SETTABLE: &[&str] = &[
    "maxmemory",
    "timeout",
    "maxclients",
    "client-query-buffer-limit",
    "requirepass",
    "slowlog-log-slower-than",
    "slowlog-max-len",
    "latency-monitor-threshold",
    "client-output-buffer-limit",
];

/// `client-output-buffer-limit`'s classes chorus does not enforce, as CONFIG GET shows them:
/// normal clients have no limit (as in Redis), and there are no Redis replicas.
const FIXED_BUFFER_LIMITS: &[(&str, Limit)] = &[
    ("normal", Limit { hard_bytes: 0, soft_bytes: 0, soft_seconds: 0 }),
    ("slave", Limit { hard_bytes: 256 << 20, soft_bytes: 64 << 20, soft_seconds: 60 }),
];

impl Live {
    pub fn new(
        requirepass: Option<&str>,
        password_required: bool,
        maxclients: usize,
        maxclients_max: u64,
        clients: &ClientLimits,
    ) -> Live {
        Live {
            user: RwLock::new(DefaultUser::with_password(requirepass)),
            password_required,
            maxmemory_bytes: AtomicU64::new(clients.maxmemory_bytes),
            idle_timeout_s: AtomicU64::new(clients.idle_timeout_s),
            maxclients: AtomicU64::new(maxclients as u64),
            maxclients_max,
            query_buffer_bytes_max: AtomicU64::new(clients.query_buffer_bytes_max as u64),
            slowlog_slower_than_us: AtomicI64::new(10_000),
            slowlog_len_max: AtomicU64::new(128),
            latency_threshold_ms: AtomicU64::new(0),
            pubsub_limits: Arc::new(OutputLimits::default()),
        }
    }

    /// The Pub/Sub hub's limits, so that CONFIG SET changes what it enforces.
    pub fn with_pubsub_limits(mut self, limits: Arc<OutputLimits>) -> Live {
        self.pubsub_limits = limits;
        self
    }

    pub fn user(&self) -> DefaultUser {
        self.user.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Replace the default user, unless that would leave a protected node without a password.
    pub fn set_user(&self, user: DefaultUser) -> Result<(), String> {
        if self.password_required && user.open() {
            return Err(
                "the default user must keep a password: this node's client port is not a loopback address and protected-mode is on"
                    .into(),
            );
        }
        *self.user.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = user;
        Ok(())
    }

    /// The current value of a [`SETTABLE`] name, as CONFIG GET shows it.
    pub fn get(&self, name: &str) -> Option<String> {
        Some(match name {
            "maxmemory" => self.maxmemory_bytes.load(Relaxed).to_string(),
            "timeout" => self.idle_timeout_s.load(Relaxed).to_string(),
            "maxclients" => self.maxclients.load(Relaxed).to_string(),
            "client-query-buffer-limit" => self.query_buffer_bytes_max.load(Relaxed).to_string(),
            // Redis answers the password itself; chorus does not hand it out again.
            "requirepass" => return None,
            "slowlog-log-slower-than" => self.slowlog_slower_than_us.load(Relaxed).to_string(),
            "slowlog-max-len" => self.slowlog_len_max.load(Relaxed).to_string(),
            "latency-monitor-threshold" => self.latency_threshold_ms.load(Relaxed).to_string(),
            "client-output-buffer-limit" => {
                let show = |class: &str, limit: Limit| {
                    format!("{class} {} {} {}", limit.hard_bytes, limit.soft_bytes, limit.soft_seconds)
                };
                let fixed = FIXED_BUFFER_LIMITS.iter().map(|(class, limit)| show(class, *limit));
                let pubsub = show("pubsub", self.pubsub_limits.get());
                fixed.chain([pubsub]).collect::<Vec<_>>().join(" ")
            }
            _ => return None,
        })
    }

    /// CONFIG SET name value [name value ...]: every pair is checked before any applies, so
    /// a bad one changes nothing (as Redis 7).
    pub fn set(&self, pairs: &[(String, Vec<u8>)]) -> Result<(), String> {
        let mut changes = Vec::with_capacity(pairs.len());
        for (name, value) in pairs {
            let change = parse(name, value)?;
            if let Change::MaxClients(count) = change {
                if count > self.maxclients_max {
                    return Err(format!(
                        "CONFIG SET failed (possibly related to argument 'maxclients') - the open-file limit leaves room for {} clients (raise ulimit -n and restart)",
                        self.maxclients_max
                    ));
                }
            }
            changes.push(change);
        }
        if let Some(Change::Password(password)) =
            changes.iter().find(|change| matches!(change, Change::Password(_)))
        {
            let user = DefaultUser::with_password(password.as_deref());
            if self.password_required && user.open() {
                return Err("requirepass cannot be emptied: this node's client port is not a loopback address and protected-mode is on".into());
            }
        }
        for change in changes {
            self.apply(change)?;
        }
        Ok(())
    }

    fn apply(&self, change: Change) -> Result<(), String> {
        match change {
            Change::MaxMemory(bytes) => self.maxmemory_bytes.store(bytes, Relaxed),
            Change::Timeout(seconds) => self.idle_timeout_s.store(seconds, Relaxed),
            Change::MaxClients(count) => self.maxclients.store(count, Relaxed),
            Change::QueryBuffer(bytes) => self.query_buffer_bytes_max.store(bytes, Relaxed),
            Change::Password(password) => self.set_user(DefaultUser::with_password(password.as_deref()))?,
            Change::SlowerThan(us) => self.slowlog_slower_than_us.store(us, Relaxed),
            Change::SlowlogLen(len) => self.slowlog_len_max.store(len, Relaxed),
            Change::LatencyThreshold(ms) => self.latency_threshold_ms.store(ms, Relaxed),
            Change::PubSubLimit(Some(limit)) => self.pubsub_limits.set(limit),
            Change::PubSubLimit(None) => {}
        }
        Ok(())
    }
}

enum Change {
    MaxMemory(u64),
    Timeout(u64),
    MaxClients(u64),
    QueryBuffer(u64),
    Password(Option<String>),
    SlowerThan(i64),
    SlowlogLen(u64),
    LatencyThreshold(u64),
    /// `None`: the value named only classes chorus does not enforce, at their shown values.
    PubSubLimit(Option<Limit>),
}

fn parse(name: &str, value: &[u8]) -> Result<Change, String> {
    let text = String::from_utf8_lossy(value);
    let invalid = |why: &str| format!("CONFIG SET failed (possibly related to argument '{name}') - {why}");
    let number = || text.parse::<u64>().map_err(|_| invalid("argument couldn't be parsed into an integer"));
    let memory =
        || crate::config::parse_memory(&text).ok_or_else(|| invalid("argument must be a memory value"));
    Ok(match name {
        "maxmemory" => Change::MaxMemory(memory()?),
        "timeout" => Change::Timeout(number()?),
        "maxclients" => match number()? {
            0 => return Err(invalid("argument must be between 1 and 4294967295 inclusive")),
            count => Change::MaxClients(count),
        },
        "client-query-buffer-limit" => match memory()? {
            bytes if bytes < 1024 * 1024 => return Err(invalid("argument must be between 1048576 and 9223372036854775807 inclusive")),
            bytes => Change::QueryBuffer(bytes),
        },
        "requirepass" => Change::Password((!value.is_empty()).then(|| text.into_owned())),
        "slowlog-log-slower-than" => {
            Change::SlowerThan(text.parse::<i64>().map_err(|_| invalid("argument couldn't be parsed into an integer"))?)
        }
        "slowlog-max-len" => Change::SlowlogLen(number()?),
        "latency-monitor-threshold" => Change::LatencyThreshold(number()?),
        "client-output-buffer-limit" => Change::PubSubLimit(parse_buffer_limits(&text).map_err(|why| invalid(&why))?),
        _ => {
            return Err(format!(
                "Unknown option or number of arguments for CONFIG SET - '{name}' (chorus changes {} at run time; the rest are read from the node's config file at start)",
                SETTABLE.join(", ")
            ))
        }
    })
}

/// `class hard soft seconds [class hard soft seconds ...]`, Redis' format and memory units.
/// Only the pubsub class may change; normal and replica are accepted at the values CONFIG
/// GET shows and refused otherwise, rather than accepted and not enforced.
fn parse_buffer_limits(text: &str) -> Result<Option<Limit>, String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    if words.is_empty() || !words.len().is_multiple_of(4) {
        return Err("Wrong number of arguments in buffer limit configuration.".into());
    }
    let mut pubsub = None;
    for group in words.chunks(4) {
        let memory = |word: &str| crate::config::parse_memory(word);
        let (Some(hard_bytes), Some(soft_bytes), Ok(soft_seconds)) =
            (memory(group[1]), memory(group[2]), group[3].parse::<u64>())
        else {
            return Err("Error in hard, soft or soft_seconds setting in buffer limit configuration.".into());
        };
        let limit = Limit { hard_bytes, soft_bytes, soft_seconds };
        match group[0].to_ascii_lowercase().as_str() {
            "pubsub" => pubsub = Some(limit),
            class @ ("normal" | "slave" | "replica") => {
                let shown = if class == "normal" { "normal" } else { "slave" };
                let fixed =
                    FIXED_BUFFER_LIMITS.iter().find(|(name, _)| *name == shown).map(|(_, limit)| *limit);
                if fixed != Some(limit) {
                    return Err(format!(
                        "chorus enforces only the pubsub class; the {class} class stays as CONFIG GET shows it"
                    ));
                }
            }
            _ => return Err("Invalid client class specified in buffer limit configuration.".into()),
        }
    }
    Ok(pubsub)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(password_required: bool) -> Live {
        Live::new(Some("secret"), password_required, 100, 1000, &ClientLimits::default())
    }

    fn pair(name: &str, value: &str) -> (String, Vec<u8>) {
        (name.into(), value.as_bytes().to_vec())
    }

    #[test]
    fn a_bad_pair_changes_nothing() {
        let live = live(false);
        let error = live.set(&[pair("timeout", "70"), pair("maxmemory", "lots")]).unwrap_err();
        assert!(error.contains("'maxmemory'"), "{error}");
        assert_eq!(live.get("timeout").unwrap(), "0");
        live.set(&[pair("timeout", "70"), pair("maxmemory", "2mb")]).unwrap();
        assert_eq!(
            (live.get("timeout").unwrap().as_str(), live.get("maxmemory").unwrap().as_str()),
            ("70", "2097152")
        );
        let error = live.set(&[pair("port", "1")]).unwrap_err();
        assert!(error.contains("Unknown option") && error.contains("maxmemory"), "{error}");
    }

    #[test]
    fn passwords_are_checked_against_every_hash() {
        let live = live(false);
        assert!(!live.user().open());
        assert!(
            live.user().accepts(b"secret") && !live.user().accepts(b"secreT") && !live.user().accepts(b"")
        );
        live.set(&[pair("requirepass", "")]).unwrap();
        assert!(live.user().open() && live.user().accepts(b"anything"));
        let off = DefaultUser { enabled: false, ..live.user() };
        live.set_user(off).unwrap();
        assert!(!live.user().open() && !live.user().accepts(b"anything"));
    }

    #[test]
    fn the_pubsub_output_buffer_limit_changes_and_other_classes_stay() {
        let live = live(false);
        assert_eq!(
            live.get("client-output-buffer-limit").unwrap(),
            "normal 0 0 0 slave 268435456 67108864 60 pubsub 33554432 8388608 60"
        );
        live.set(&[pair("client-output-buffer-limit", "pubsub 1mb 256kb 10")]).unwrap();
        assert_eq!(
            live.pubsub_limits.get(),
            Limit { hard_bytes: 1 << 20, soft_bytes: 256 << 10, soft_seconds: 10 }
        );
        live.set(&[pair("client-output-buffer-limit", "normal 0 0 0 pubsub 0 0 0")]).unwrap();
        assert_eq!(live.pubsub_limits.get(), Limit { hard_bytes: 0, soft_bytes: 0, soft_seconds: 0 });
        for bad in ["pubsub 1mb 1mb", "pubsub lots 1 1", "other 1 1 1", "normal 1mb 0 0 pubsub 1 1 1"] {
            assert!(live.set(&[pair("client-output-buffer-limit", bad)]).is_err(), "{bad}");
        }
        assert_eq!(live.pubsub_limits.get().hard_bytes, 0, "a refused value changed nothing");
    }

    #[test]
    fn a_protected_node_keeps_a_password() {
        let live = live(true);
        assert!(live.set(&[pair("requirepass", "")]).is_err());
        assert!(live.set_user(DefaultUser::with_password(None)).is_err());
        assert!(live.user().accepts(b"secret"), "unchanged");
        live.set(&[pair("requirepass", "other")]).unwrap();
        assert!(live.user().accepts(b"other") && !live.user().accepts(b"secret"));
    }
}
