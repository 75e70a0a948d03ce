//! Commands over several keys (ZUNIONSTORE, SINTERSTORE, RENAME, COPY, LMOVE, SMOVE, ...)
//! and the blocking pops. Each key's part is one linearizable read or update, as MSET's are;
//! the command as a whole is **not atomic** across keys (docs/resp.md, "Multi-key commands"):
//! another client may see the source updated and the destination not yet.
//!
//! Blocking pops (BLPOP, BZPOPMIN, ...) poll: they try the non-blocking pop on each key, in
//! order, every `BLOCK_POLL_MS` until one answers or the timeout passes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chorus_core::data::value::{self, Entry, Typed};
use chorus_core::data::{format_double, parse_float, parse_int};
use chorus_core::{Command, Outcome};
use tokio::io::{AsyncRead, AsyncWrite};

use super::{unexpected, Connection};
use crate::command::{self, error_reply};
use crate::resp::Reply;

const BLOCK_POLL_MS: u64 = 10;
const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

impl<S: AsyncRead + AsyncWrite + Unpin + Send> Connection<S> {
    /// The key's live value, judged by this replica's clock (`None`: absent or expired).
    async fn read_entry(&mut self, key: &Bytes) -> Result<Option<Entry>, Reply> {
        match self.run_one(Command::Read { key: key.clone() }).await {
            Outcome::Value(None) => Ok(None),
            Outcome::Value(Some(raw)) => {
                let entry = value::decode(&raw).map_err(|_| Reply::err("stored value is corrupt"))?;
                Ok(entry.deadline_ms.is_none_or(|at| at > command::wall_clock_ms()).then_some(entry))
            }
            Outcome::Error(error) => Err(error_reply(&error)),
            other => Err(unexpected(other)),
        }
    }

    /// Replace the key's whole value (`None` deletes it), within the size limit.
    async fn put_entry(&mut self, key: Bytes, entry: Option<&Entry>) -> Result<(), Reply> {
        let encoded = entry.and_then(value::encode);
        if encoded.as_ref().is_some_and(|bytes| bytes.len() > self.bytes_max()) {
            return Err(Reply::err("the value would exceed the size limit (value_bytes_max)"));
        }
        match self.run_one(Command::Write { key, value: encoded }).await {
            Outcome::Written => Ok(()),
            Outcome::Error(error) => Err(error_reply(&error)),
            other => Err(unexpected(other)),
        }
    }

    /// A sorted set or a set (members scored 1) for the ZUNION family; WRONGTYPE otherwise.
    async fn read_scored(&mut self, key: &Bytes) -> Result<BTreeMap<Bytes, f64>, Reply> {
        match self.read_entry(key).await? {
            None => Ok(BTreeMap::new()),
            Some(Entry { value: Typed::ZSet(members), .. }) => Ok(members),
            Some(Entry { value: Typed::Set(members), .. }) => {
                Ok(members.into_iter().map(|m| (m, 1.0)).collect())
            }
            Some(_) => Err(Reply::error(WRONGTYPE)),
        }
    }

    pub(super) async fn multikey(&mut self, name: &str, args: &[Bytes]) -> Reply {
        let result = match name {
            "zunionstore" | "zinterstore" | "zdiffstore" => self.zstore(name, args).await,
            "zunion" | "zinter" | "zdiff" | "zintercard" => self.zcombine(name, &args[1..]).await,
            "sinterstore" | "sunionstore" | "sdiffstore" => self.sstore(name, args).await,
            "rename" | "renamenx" => self.rename(name == "renamenx", args).await,
            "copy" => self.copy(args).await,
            "lmove" => self.lmove(&args[1], &args[2], &args[3], &args[4]).await,
            "rpoplpush" => self.lmove(&args[1], &args[2], b"RIGHT", b"LEFT").await,
            "smove" => self.smove(args).await,
            "blpop" | "brpop" | "bzpopmin" | "bzpopmax" | "blmove" | "brpoplpush" => {
                self.blocking(name, args).await
            }
            _ => Err(Reply::err(format!("internal error: unhandled multi-key command '{name}'"))),
        };
        result.unwrap_or_else(|reply| reply)
    }

    /// `numkeys key... [WEIGHTS w...] [AGGREGATE SUM|MIN|MAX] [WITHSCORES] [LIMIT n]`.
    async fn zcombine_parts(
        &mut self,
        name: &str,
        args: &[Bytes],
    ) -> Result<(BTreeMap<Bytes, f64>, bool, usize), Reply> {
        let numkeys =
            parse_int(&args[0]).map_err(|_| Reply::err("value is not an integer or out of range"))?;
        if numkeys <= 0 {
            return Err(Reply::err(format!("at least 1 input key is needed for '{name}' command")));
        }
        let numkeys = numkeys as usize;
        if args.len() < 1 + numkeys {
            return Err(Reply::err("syntax error"));
        }
        let keys = &args[1..1 + numkeys];
        let (mut weights, mut aggregate, mut scores, mut limit) =
            (vec![1.0; numkeys], "SUM".to_string(), false, 0);
        let mut at = 1 + numkeys;
        let algebra = !name.starts_with("zdiff") && name != "zintercard";
        while at < args.len() {
            let word = String::from_utf8_lossy(&args[at]).to_ascii_uppercase();
            match word.as_str() {
                "WEIGHTS" if algebra && at + numkeys < args.len() => {
                    for (i, weight) in args[at + 1..=at + numkeys].iter().enumerate() {
                        weights[i] =
                            parse_float(weight).map_err(|_| Reply::err("weight value is not a float"))?;
                    }
                    at += numkeys;
                }
                "AGGREGATE" if algebra && at + 1 < args.len() => {
                    aggregate = String::from_utf8_lossy(&args[at + 1]).to_ascii_uppercase();
                    if !["SUM", "MIN", "MAX"].contains(&aggregate.as_str()) {
                        return Err(Reply::err("syntax error"));
                    }
                    at += 1;
                }
                "WITHSCORES" if !name.ends_with("store") && name != "zintercard" => scores = true,
                "LIMIT" if name == "zintercard" && at + 1 < args.len() => {
                    limit = parse_int(&args[at + 1])
                        .ok()
                        .and_then(|n| usize::try_from(n).ok())
                        .ok_or_else(|| Reply::err("LIMIT can't be negative"))?;
                    at += 1;
                }
                _ => return Err(Reply::err("syntax error")),
            }
            at += 1;
        }
        let mut sets = Vec::with_capacity(numkeys);
        for key in keys {
            sets.push(self.read_scored(key).await?);
        }
        let combine = |a: f64, b: f64| match aggregate.as_str() {
            "MIN" => a.min(b),
            "MAX" => a.max(b),
            // inf + -inf is NaN in IEEE; Redis makes it 0.
            _ => Some(a + b).filter(|sum| !sum.is_nan()).unwrap_or(0.0),
        };
        let weighted = |score: f64, weight: f64| Some(score * weight).filter(|s| !s.is_nan()).unwrap_or(0.0);
        let mut sets = sets.into_iter().zip(weights);
        let (first, weight) = sets.next().expect("numkeys > 0");
        let mut result: BTreeMap<Bytes, f64> =
            first.into_iter().map(|(m, s)| (m, weighted(s, weight))).collect();
        for (set, weight) in sets {
            match name {
                "zunion" | "zunionstore" => {
                    for (member, score) in set {
                        let score = weighted(score, weight);
                        result.entry(member).and_modify(|s| *s = combine(*s, score)).or_insert(score);
                    }
                }
                "zinter" | "zinterstore" | "zintercard" => {
                    result = result
                        .into_iter()
                        .filter_map(|(m, s)| {
                            set.get(&m).map(|other| (m, combine(s, weighted(*other, weight))))
                        })
                        .collect();
                }
                _ => result.retain(|member, _| !set.contains_key(member)),
            }
        }
        Ok((result, scores, limit))
    }

    async fn zcombine(&mut self, name: &str, args: &[Bytes]) -> Result<Reply, Reply> {
        let (result, scores, limit) = self.zcombine_parts(name, args).await?;
        if name == "zintercard" {
            let count = if limit == 0 { result.len() } else { result.len().min(limit) };
            return Ok(Reply::Integer(count as i64));
        }
        let mut ordered: Vec<(Bytes, f64)> = result.into_iter().collect();
        ordered.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
        let mut out = Vec::new();
        for (member, score) in ordered {
            out.push(Reply::Bulk(member));
            if scores {
                out.push(Reply::Bulk(Bytes::from(format_double(score))));
            }
        }
        Ok(Reply::Array(out))
    }

    async fn zstore(&mut self, name: &str, args: &[Bytes]) -> Result<Reply, Reply> {
        let (result, _, _) = self.zcombine_parts(name.trim_end_matches("store"), &args[2..]).await?;
        let count = result.len() as i64;
        self.put_entry(args[1].clone(), Some(&Entry { value: Typed::ZSet(result), deadline_ms: None }))
            .await?;
        Ok(Reply::Integer(count))
    }

    async fn sstore(&mut self, name: &str, args: &[Bytes]) -> Result<Reply, Reply> {
        let mut sets = Vec::new();
        for key in &args[2..] {
            match self.read_entry(key).await? {
                None => sets.push(Default::default()),
                Some(Entry { value: Typed::Set(members), .. }) => sets.push(members),
                Some(_) => return Err(Reply::error(WRONGTYPE)),
            }
        }
        let mut sets = sets.into_iter();
        let first: std::collections::BTreeSet<Bytes> = sets.next().unwrap_or_default();
        let result: std::collections::BTreeSet<Bytes> = sets.fold(first, |acc, set| match name {
            "sinterstore" => acc.intersection(&set).cloned().collect(),
            "sunionstore" => acc.union(&set).cloned().collect(),
            _ => acc.difference(&set).cloned().collect(),
        });
        let count = result.len() as i64;
        self.put_entry(args[1].clone(), Some(&Entry { value: Typed::Set(result), deadline_ms: None }))
            .await?;
        Ok(Reply::Integer(count))
    }

    /// RENAME keeps the deadline, as Redis does: the stored bytes move as they are.
    async fn rename(&mut self, nx: bool, args: &[Bytes]) -> Result<Reply, Reply> {
        let Some(entry) = self.read_entry(&args[1]).await? else { return Err(Reply::err("no such key")) };
        if args[1] == args[2] {
            return Ok(if nx { Reply::Integer(0) } else { Reply::ok() });
        }
        if nx && self.read_entry(&args[2]).await?.is_some() {
            return Ok(Reply::Integer(0));
        }
        self.put_entry(args[2].clone(), Some(&entry)).await?;
        self.put_entry(args[1].clone(), None).await?;
        Ok(if nx { Reply::Integer(1) } else { Reply::ok() })
    }

    async fn copy(&mut self, args: &[Bytes]) -> Result<Reply, Reply> {
        let mut replace = false;
        let mut at = 3;
        while at < args.len() {
            match args[at].to_ascii_uppercase().as_slice() {
                b"REPLACE" => replace = true,
                b"DB" if at + 1 < args.len() && args[at + 1].as_ref() == b"0" => at += 1,
                b"DB" => return Err(Reply::err("DB index is out of range")),
                _ => return Err(Reply::err("syntax error")),
            }
            at += 1;
        }
        let Some(entry) = self.read_entry(&args[1]).await? else { return Ok(Reply::Integer(0)) };
        if !replace && self.read_entry(&args[2]).await?.is_some() {
            return Ok(Reply::Integer(0));
        }
        self.put_entry(args[2].clone(), Some(&entry)).await?;
        Ok(Reply::Integer(1))
    }

    /// The destination must hold a list (or nothing) before anything is popped.
    async fn expect_type(&mut self, key: &Bytes, wanted: &str) -> Result<(), Reply> {
        match self.read_entry(key).await? {
            Some(entry) if entry.value.type_name() != wanted => Err(Reply::error(WRONGTYPE)),
            _ => Ok(()),
        }
    }

    async fn lmove(
        &mut self,
        source: &Bytes,
        destination: &Bytes,
        from: &[u8],
        to: &[u8],
    ) -> Result<Reply, Reply> {
        let side = |word: &[u8], left: &'static [u8], right: &'static [u8]| match word
            .to_ascii_uppercase()
            .as_slice()
        {
            b"LEFT" => Ok(left),
            b"RIGHT" => Ok(right),
            _ => Err(Reply::err("syntax error")),
        };
        let (pop, push) = (side(from, b"LPOP", b"RPOP")?, side(to, b"LPUSH", b"RPUSH")?);
        self.expect_type(source, "list").await?;
        self.expect_type(destination, "list").await?;
        let element = match self.run_data(vec![Bytes::from_static(pop), source.clone()]).await {
            Reply::Bulk(element) => element,
            other => return Ok(other),
        };
        match self.run_data(vec![Bytes::from_static(push), destination.clone(), element.clone()]).await {
            Reply::Integer(_) => Ok(Reply::Bulk(element)),
            other => Err(other),
        }
    }

    async fn smove(&mut self, args: &[Bytes]) -> Result<Reply, Reply> {
        self.expect_type(&args[1], "set").await?;
        self.expect_type(&args[2], "set").await?;
        match self.run_data(vec![Bytes::from_static(b"SREM"), args[1].clone(), args[3].clone()]).await {
            Reply::Integer(0) => return Ok(Reply::Integer(0)),
            Reply::Integer(_) => {}
            other => return Err(other),
        }
        match self.run_data(vec![Bytes::from_static(b"SADD"), args[2].clone(), args[3].clone()]).await {
            Reply::Integer(_) => Ok(Reply::Integer(1)),
            other => Err(other),
        }
    }

    /// BLPOP/BRPOP/BZPOPMIN/BZPOPMAX key... timeout, BLMOVE src dst from to timeout,
    /// BRPOPLPUSH src dst timeout: the non-blocking form, retried until the timeout.
    async fn blocking(&mut self, name: &str, args: &[Bytes]) -> Result<Reply, Reply> {
        let timeout_s = parse_float(args.last().expect("arity"))
            .ok()
            .filter(|t| *t >= 0.0 && t.is_finite())
            .ok_or_else(|| Reply::err("timeout is not a float or out of range"))?;
        let deadline = (timeout_s > 0.0).then(|| Instant::now() + Duration::from_secs_f64(timeout_s));
        loop {
            if let Some(reply) = self.try_pop(name, args).await? {
                return Ok(reply);
            }
            if deadline.is_some_and(|at| Instant::now() >= at) {
                return Ok(if name.starts_with("blmove") || name == "brpoplpush" {
                    Reply::Null
                } else {
                    Reply::NullArray
                });
            }
            tokio::time::sleep(Duration::from_millis(BLOCK_POLL_MS)).await;
        }
    }

    async fn try_pop(&mut self, name: &str, args: &[Bytes]) -> Result<Option<Reply>, Reply> {
        if name == "blmove" || name == "brpoplpush" {
            let (from, to): (&[u8], &[u8]) =
                if name == "blmove" { (&args[3], &args[4]) } else { (b"RIGHT", b"LEFT") };
            return match self.lmove(&args[1], &args[2], from, to).await? {
                Reply::Null => Ok(None),
                reply => Ok(Some(reply)),
            };
        }
        let pop: &'static [u8] = match name {
            "blpop" => b"LPOP",
            "brpop" => b"RPOP",
            "bzpopmin" => b"ZPOPMIN",
            _ => b"ZPOPMAX",
        };
        for key in &args[1..args.len() - 1] {
            match self.run_data(vec![Bytes::from_static(pop), key.clone()]).await {
                Reply::Bulk(element) => {
                    return Ok(Some(Reply::Array(vec![Reply::Bulk(key.clone()), Reply::Bulk(element)])))
                }
                Reply::Array(popped) if !popped.is_empty() => {
                    let mut reply = vec![Reply::Bulk(key.clone())];
                    reply.extend(popped);
                    return Ok(Some(Reply::Array(reply)));
                }
                Reply::Null | Reply::NullArray | Reply::Array(_) => {}
                other => return Err(other),
            }
        }
        Ok(None)
    }
}

/// Names of the commands [`Connection::multikey`] runs.
pub const COMMANDS: &[&str] = &[
    "zunionstore",
    "zinterstore",
    "zdiffstore",
    "zunion",
    "zinter",
    "zdiff",
    "zintercard",
    "sinterstore",
    "sunionstore",
    "sdiffstore",
    "rename",
    "renamenx",
    "copy",
    "lmove",
    "rpoplpush",
    "smove",
    "blpop",
    "brpop",
    "bzpopmin",
    "bzpopmax",
    "blmove",
    "brpoplpush",
];
