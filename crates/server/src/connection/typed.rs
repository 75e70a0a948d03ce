//! The commands beyond plain strings: typed commands (lists, sets, sorted sets, expiry, the
//! hash family) run by `chorus_core::data`, commands over the key list (KEYS, SCAN, ...) and
//! commands about the server or this connection (TIME, ACL, CLIENT LIST, ...).
//!
//! A typed command that only reads runs on a locally read value. If that finds the key's
//! deadline passed, the command is re-run as a replicated RMW, so that the expiry is decided
//! by one write every replica applies, never by one replica's clock alone (docs/expiry.md).

use bytes::Bytes;
use chorus_core::data::{self, Access, ExecOp};
use chorus_core::{Command, Outcome, RmwOp};
use tokio::io::{AsyncRead, AsyncWrite};

use super::{count_values, reads, unexpected, Connection};
use crate::command::{self, error_reply, Request};
use crate::resp::Reply;

impl<S: AsyncRead + AsyncWrite + Unpin + Send> Connection<S> {
    /// The largest value a command may leave under one key.
    pub(super) fn bytes_max(&self) -> usize {
        self.shared.settings.limits.bulk_bytes_max
    }

    /// Run a typed command: reads locally (unless the key expired), updates as one RMW.
    pub(super) async fn run_data(&mut self, args: Vec<Bytes>) -> Reply {
        let name = String::from_utf8_lossy(&args[0]).to_ascii_lowercase();
        let key = data::key_of(&args).clone();
        if data::access(&name) == Some(Access::Read) {
            let op = ExecOp { now_ms: command::wall_clock_ms(), bytes_max: self.bytes_max() as u32, args };
            match self.run_one(Command::Read { key }).await {
                Outcome::Value(value) => {
                    let effect = data::apply(&op, value.as_ref());
                    if effect.write.is_none() {
                        return command::data_reply(effect.outcome);
                    }
                    // The key's deadline passed: a replicated write decides (below).
                    return self.run_exec(op.args).await;
                }
                Outcome::Error(error) => return error_reply(&error),
                other => return unexpected(other),
            }
        }
        self.run_exec(args).await
    }

    async fn run_exec(&mut self, args: Vec<Bytes>) -> Reply {
        let command = command::exec_command(args, command::wall_clock_ms(), self.bytes_max());
        command::data_reply(self.run_one(command).await)
    }

    /// HSET/HMSET/HDEL: the hash RMWs, or the typed path for a hash with a deadline.
    pub(super) async fn update_hash(&mut self, request: Request) -> Reply {
        let (key, op, reply_ok) = match &request {
            Request::HSet { key, pairs, reply_ok } => {
                let encoded_bytes_max = u32::try_from(self.bytes_max()).unwrap_or(u32::MAX);
                (key.clone(), RmwOp::HashSet { pairs: pairs.clone(), encoded_bytes_max }, *reply_ok)
            }
            Request::HDel { key, fields } => (key.clone(), RmwOp::HashDelete(fields.clone()), false),
            other => return Reply::err(format!("internal error: not a hash update: {other:?}")),
        };
        match self.run_one(Command::Rmw { key, op }).await {
            Outcome::Integer(_) if reply_ok => Reply::ok(),
            Outcome::Integer(count) => Reply::Integer(count),
            outcome if command::needs_typed(&outcome) => match command::as_typed(&request) {
                Some(args) => self.run_data(args).await,
                None => unexpected(outcome),
            },
            Outcome::Error(chorus_core::CommandError::ValueTooLarge) => {
                Reply::err("the hash would exceed the value size limit")
            }
            Outcome::Error(error) => error_reply(&error),
            other => unexpected(other),
        }
    }

    /// Per key: one local read; a key with a deadline goes through the typed EXISTS.
    pub(super) async fn exists(&mut self, keys: Vec<Bytes>) -> Reply {
        let outcomes = self.run_all(reads(&keys)).await;
        let mut count = 0;
        for (key, outcome) in keys.into_iter().zip(outcomes) {
            match outcome {
                Outcome::Value(Some(value)) if data::has_deadline(&value) => {
                    match self.run_data(words(&[b"EXISTS", &key])).await {
                        Reply::Integer(found) => count += found,
                        other => return other,
                    }
                }
                Outcome::Value(Some(_)) => count += 1,
                Outcome::Value(None) => {}
                Outcome::Error(error) => return error_reply(&error),
                other => return unexpected(other),
            }
        }
        Reply::Integer(count)
    }

    /// Like Redis: nil for keys that do not hold strings.
    pub(super) async fn mget(&mut self, keys: Vec<Bytes>) -> Reply {
        let outcomes = self.run_all(reads(&keys)).await;
        let mut values = Vec::with_capacity(outcomes.len());
        for (key, outcome) in keys.into_iter().zip(outcomes) {
            values.push(match outcome {
                Outcome::Value(Some(value)) if data::has_deadline(&value) => {
                    match self.run_data(words(&[b"GET", &key])).await {
                        Reply::Error(line) if !line.starts_with("WRONGTYPE") => return Reply::Error(line),
                        Reply::Error(_) => Reply::Null,
                        reply => reply,
                    }
                }
                Outcome::Value(Some(value)) if data::is_reserved(&value) => Reply::Null,
                Outcome::Value(value) => Reply::optional(value),
                Outcome::Error(error) => return error_reply(&error),
                other => return unexpected(other),
            });
        }
        Reply::Array(values)
    }

    /// DEL: read each key (local), then swap present keys to absent to learn whether each
    /// delete removed something; a typed key goes through the typed DEL (an expired key is
    /// not counted). A key absent at the read is linearized there as a no-op.
    pub(super) async fn del(&mut self, keys: Vec<Bytes>) -> Reply {
        let outcomes = self.run_all(reads(&keys)).await;
        let (mut present, mut expiring) = (Vec::new(), Vec::new());
        for (key, outcome) in keys.into_iter().zip(outcomes) {
            match outcome {
                // Typed values (a deadline, a list, ...) are deleted by the typed DEL, which
                // judges the deadline; the Swap below only takes strings and hashes.
                outcome if command::needs_typed(&outcome) => expiring.push(key),
                Outcome::Value(Some(_)) => present.push(Command::Rmw { key, op: RmwOp::Swap(None) }),
                Outcome::Value(None) => {}
                Outcome::Error(error) => return error_reply(&error),
                other => return unexpected(other),
            }
        }
        let mut count = match count_values(self.run_all(present).await) {
            Reply::Integer(count) => count,
            other => return other,
        };
        for key in expiring {
            match self.run_data(words(&[b"DEL", &key])).await {
                Reply::Integer(removed) => count += removed,
                other => return other,
            }
        }
        Reply::Integer(count)
    }

    /// This replica's live keys (values read locally, expiry judged by this replica's clock:
    /// KEYS, SCAN and RANDOMKEY are not linearizable, as docs/resp.md says), sorted.
    async fn live_keys(&mut self) -> Result<Vec<(Bytes, Bytes)>, Reply> {
        self.live_keys_where(|_| true).await
    }

    /// [`Self::live_keys`] among the keys `keep` selects (read only those).
    pub(super) async fn live_keys_where(
        &mut self,
        keep: impl Fn(&Bytes) -> bool,
    ) -> Result<Vec<(Bytes, Bytes)>, Reply> {
        let mut keys = self.engine().keys().await;
        keys.retain(|key| keep(key));
        keys.sort();
        let outcomes = self.run_all(reads(&keys)).await;
        let now_ms = command::wall_clock_ms();
        let mut live = Vec::with_capacity(keys.len());
        for (key, outcome) in keys.into_iter().zip(outcomes) {
            match outcome {
                Outcome::Value(Some(value)) => {
                    let expired = data::value::split_deadline(&value)
                        .is_ok_and(|(deadline, _)| deadline.is_some_and(|at| at <= now_ms));
                    if !expired {
                        live.push((key, value));
                    }
                }
                Outcome::Value(None) => {}
                Outcome::Error(error) => return Err(error_reply(&error)),
                other => return Err(unexpected(other)),
            }
        }
        Ok(live)
    }

    /// CLUSTER, READONLY, READWRITE, ASKING, MIGRATE (cluster/command.rs).
    pub(super) async fn cluster(&mut self, args: Vec<Bytes>) -> Reply {
        use crate::cluster::command::{keys_reply, plan, Plan};
        let map = self.shared.cluster.as_ref().map(|cluster| cluster.map());
        match plan(&args, map.as_deref()) {
            Plan::Answer(reply) => reply,
            Plan::Asking => {
                self.asking = true;
                Reply::ok()
            }
            Plan::Move { slot, group, until } => self.move_slot(slot, group, until).await,
            Plan::Cancel { slot } => self.cancel_move(slot).await,
            Plan::Migrate { to, keys, password } => self.migrate(to, keys, password).await,
            Plan::CopyIn { slot, began, args } => self.copy_in(slot, began, args).await,
            Plan::KeysInSlot { slot, count } => {
                let in_slot = |key: &Bytes| chorus_core::slots::key_slot(key) == slot;
                match self.live_keys_where(in_slot).await {
                    Ok(live) => keys_reply(live.into_iter().map(|(key, _)| key).collect(), count),
                    Err(reply) => reply,
                }
            }
        }
    }

    pub(super) async fn keyspace(&mut self, args: Vec<Bytes>) -> Reply {
        let name = String::from_utf8_lossy(&args[0]).to_ascii_lowercase();
        match name.as_str() {
            "keys" => match self.live_keys().await {
                Ok(live) => Reply::Array(
                    live.into_iter()
                        .filter(|(key, _)| data::glob_match(&args[1], key))
                        .map(|(key, _)| Reply::Bulk(key))
                        .collect(),
                ),
                Err(reply) => reply,
            },
            "scan" => self.scan(&args).await,
            "randomkey" => match self.live_keys().await {
                Ok(live) if live.is_empty() => Reply::Null,
                Ok(live) => {
                    let at = (command::wall_clock_ms() as usize ^ self.id as usize) % live.len();
                    Reply::Bulk(live[at].0.clone())
                }
                Err(reply) => reply,
            },
            "sinter" | "sunion" | "sdiff" => self.set_algebra(&name, &args[1..]).await,
            "sintercard" => self.sintercard(&args).await,
            "msetnx" => Reply::err(
                "MSETNX cannot be atomic across keys in chorus (each key is its own register); use SET NX per key, or MULTI/EXEC with protocol raftlog",
            ),
            _ => self.multikey(&name, &args).await,
        }
    }

    async fn scan(&mut self, args: &[Bytes]) -> Reply {
        let Ok(cursor) = data::parse_int(&args[1]).map(|c| c.max(0) as usize) else {
            return Reply::err("invalid cursor");
        };
        let (mut pattern, mut count, mut kind) = (None, 10usize, None);
        let mut at = 2;
        while at + 1 < args.len() {
            match args[at].to_ascii_uppercase().as_slice() {
                b"MATCH" => pattern = Some(args[at + 1].clone()),
                b"COUNT" => match data::parse_int(&args[at + 1]) {
                    Ok(n) if n > 0 => count = n as usize,
                    _ => return Reply::err("syntax error"),
                },
                b"TYPE" => kind = Some(String::from_utf8_lossy(&args[at + 1]).to_ascii_lowercase()),
                _ => return Reply::err("syntax error"),
            }
            at += 2;
        }
        if at != args.len() {
            return Reply::err("syntax error");
        }
        let live = match self.live_keys().await {
            Ok(live) => live,
            Err(reply) => return reply,
        };
        let start = cursor.min(live.len());
        let end = start.saturating_add(count).min(live.len());
        let page = live[start..end]
            .iter()
            .filter(|(key, _)| pattern.as_ref().is_none_or(|p| data::glob_match(p, key)))
            .filter(|(_, value)| kind.as_ref().is_none_or(|kind| type_name(value) == kind))
            .map(|(key, _)| Reply::Bulk(key.clone()))
            .collect();
        let next = if end == live.len() { 0 } else { end };
        Reply::Array(vec![Reply::text(&next.to_string()), Reply::Array(page)])
    }

    /// Each key read on its own (per key linearizable; not a snapshot across keys).
    async fn read_sets(&mut self, keys: &[Bytes]) -> Result<Vec<Vec<Bytes>>, Reply> {
        let mut sets = Vec::with_capacity(keys.len());
        for key in keys {
            match self.run_data(words(&[b"SMEMBERS", key])).await {
                Reply::Array(members) => sets.push(
                    members
                        .into_iter()
                        .filter_map(|m| if let Reply::Bulk(m) = m { Some(m) } else { None })
                        .collect(),
                ),
                other => return Err(other),
            }
        }
        Ok(sets)
    }

    async fn set_algebra(&mut self, name: &str, keys: &[Bytes]) -> Reply {
        let sets = match self.read_sets(keys).await {
            Ok(sets) => sets,
            Err(reply) => return reply,
        };
        Reply::Array(combine(name, sets).into_iter().map(Reply::Bulk).collect())
    }

    async fn sintercard(&mut self, args: &[Bytes]) -> Reply {
        let count = match data::parse_int(&args[1]) {
            Ok(n) if n > 0 && (n as usize) <= args.len() - 2 => n as usize,
            Ok(n) if n > 0 => return Reply::err("Number of keys can't be greater than number of args"),
            _ => return Reply::err("numkeys should be greater than 0"),
        };
        let mut limit = usize::MAX;
        match &args[2 + count..] {
            [] => {}
            [word, n] if word.eq_ignore_ascii_case(b"LIMIT") => match data::parse_int(n) {
                Ok(0) => {}
                Ok(n) if n > 0 => limit = n as usize,
                _ => return Reply::err("LIMIT can't be negative"),
            },
            _ => return Reply::err("syntax error"),
        }
        match self.read_sets(&args[2..2 + count]).await {
            Ok(sets) => Reply::Integer(combine("sinter", sets).len().min(limit) as i64),
            Err(reply) => reply,
        }
    }

    pub(super) async fn admin(&mut self, args: Vec<Bytes>) -> Reply {
        let view = crate::admin::ClientView {
            id: self.id,
            name: self.name.clone(),
            resp: self.resp,
            started: self.shared.metrics.started,
            shared: &self.shared,
        };
        crate::admin::run(&args, &view)
    }
}

fn words(parts: &[&[u8]]) -> Vec<Bytes> {
    parts.iter().map(|part| Bytes::copy_from_slice(part)).collect()
}

/// SINTER / SUNION / SDIFF of sorted member lists.
pub(super) fn combine(name: &str, sets: Vec<Vec<Bytes>>) -> Vec<Bytes> {
    use std::collections::BTreeSet;
    let mut sets = sets.into_iter().map(|set| set.into_iter().collect::<BTreeSet<Bytes>>());
    let Some(first) = sets.next() else { return Vec::new() };
    let result = sets.fold(first, |acc, set| match name {
        "sinter" => acc.intersection(&set).cloned().collect(),
        "sunion" => acc.union(&set).cloned().collect(),
        _ => acc.difference(&set).cloned().collect(),
    });
    result.into_iter().collect()
}

/// TYPE of a stored value, for SCAN ... TYPE.
fn type_name(value: &Bytes) -> &'static str {
    data::value::decode(value).map_or("none", |entry| entry.value.type_name())
}
