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
use chorus_core::data::{format_double, hll, parse_float, parse_int};
use chorus_core::{Command, Outcome};
use tokio::io::{AsyncRead, AsyncWrite};

use super::{unexpected, Connection};
use crate::command::{self, error_reply};
use crate::resp::Reply;

const BLOCK_POLL_MS: u64 = 10;

/// XREAD's `BLOCK ms` among the options before STREAMS, if given.
fn block_option(options: &[Bytes]) -> Result<Option<u64>, Reply> {
    let Some(at) = options.iter().position(|arg| arg.eq_ignore_ascii_case(b"block")) else { return Ok(None) };
    let ms = options
        .get(at + 1)
        .and_then(|arg| parse_int(arg).ok())
        .ok_or_else(|| Reply::err("timeout is not an integer or out of range"))?;
    u64::try_from(ms).map(Some).map_err(|_| Reply::err("timeout is negative"))
}
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
            "blpop" | "brpop" | "bzpopmin" | "bzpopmax" | "blmove" | "brpoplpush" | "blmpop" | "bzmpop" => {
                self.blocking(name, args).await
            }
            "lmpop" | "zmpop" => {
                self.mpop(name, &args[1..]).await.map(|popped| popped.unwrap_or(Reply::NullArray))
            }
            "sort" | "sort_ro" => self.sort(name, args).await,
            "bitop" => self.bitop(args).await,
            "pfcount" => self.pfcount(&args[1..]).await,
            "pfmerge" => self.pfmerge(args).await,
            "lcs" => self.lcs(args).await,
            "geosearchstore" | "georadius" | "georadiusbymember" => self.geo_store(name, args).await,
            "zrangestore" => self.zrangestore(args).await,
            "xread" | "xreadgroup" => self.stream_read(args).await,
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
        let sets = sets.into_iter().map(|set| set.into_iter().collect()).collect();
        let result: std::collections::BTreeSet<Bytes> =
            super::typed::combine(name.trim_end_matches("store"), sets).into_iter().collect();
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
        let timeout_at = if name == "blmpop" || name == "bzmpop" { 1 } else { args.len() - 1 };
        let timeout_s = parse_float(&args[timeout_at])
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
        if name == "blmpop" || name == "bzmpop" {
            return self.mpop(&name[1..], &args[2..]).await;
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

impl<S: AsyncRead + AsyncWrite + Unpin + Send> Connection<S> {
    /// XREAD/XREADGROUP `[options] STREAMS key... id...`: one op per key (each linearizable,
    /// the whole not atomic, as MGET), keys with nothing new left out, nil if none has
    /// anything. With BLOCK it polls like the blocking pops; `$` is resolved once, first.
    async fn stream_read(&mut self, args: &[Bytes]) -> Result<Reply, Reply> {
        let streams = args
            .iter()
            .position(|arg| arg.eq_ignore_ascii_case(b"streams"))
            .ok_or_else(|| Reply::err("syntax error"))?;
        let listed = &args[streams + 1..];
        if listed.is_empty() || !listed.len().is_multiple_of(2) {
            return Err(Reply::err(
                "Unbalanced 'xread' list of streams: for each stream key an ID or '$' must be specified.",
            ));
        }
        let (keys, ids) = listed.split_at(listed.len() / 2);
        let block_ms = block_option(&args[..streams])?;
        let mut ids = ids.to_vec();
        for (key, id) in keys.iter().zip(&mut ids) {
            if id.as_ref() == b"$" && block_ms.is_some() {
                *id = self.last_stream_id(key).await?;
            }
        }
        let deadline = block_ms.filter(|ms| *ms > 0).map(|ms| Instant::now() + Duration::from_millis(ms));
        loop {
            let mut found = Vec::new();
            for (key, id) in keys.iter().zip(&ids) {
                let mut one: Vec<Bytes> = args[..=streams].to_vec();
                one.extend([key.clone(), id.clone()]);
                match self.run_data(one).await {
                    Reply::NullArray => {}
                    Reply::Array(entries) => found.push((Reply::Bulk(key.clone()), Reply::Array(entries))),
                    other => return Err(other),
                }
            }
            if !found.is_empty() {
                return Ok(if self.resp >= 3 {
                    Reply::Map(found)
                } else {
                    Reply::Array(
                        found.into_iter().map(|(key, entries)| Reply::Array(vec![key, entries])).collect(),
                    )
                });
            }
            if block_ms.is_none() || deadline.is_some_and(|at| Instant::now() >= at) {
                return Ok(Reply::NullArray);
            }
            tokio::time::sleep(Duration::from_millis(BLOCK_POLL_MS)).await;
        }
    }

    /// The stream's last ID (`0-0` if absent), for `$` in a blocking read.
    async fn last_stream_id(&mut self, key: &Bytes) -> Result<Bytes, Reply> {
        match self.read_entry(key).await? {
            None => Ok(Bytes::from_static(b"0-0")),
            Some(Entry { value: Typed::Stream(stream), .. }) => {
                Ok(Bytes::from(format!("{}-{}", stream.last_id.ms, stream.last_id.seq)))
            }
            Some(_) => Err(Reply::error(WRONGTYPE)),
        }
    }

    /// LMPOP/ZMPOP `numkeys key... LEFT|RIGHT|MIN|MAX [COUNT n]`: pop from the first
    /// non-empty key; `None` if all are empty.
    async fn mpop(&mut self, name: &str, args: &[Bytes]) -> Result<Option<Reply>, Reply> {
        let numkeys = parse_int(&args[0])
            .ok()
            .filter(|n| *n > 0)
            .map(|n| n as usize)
            .ok_or_else(|| Reply::err("numkeys should be greater than 0"))?;
        if args.len() < numkeys + 2 {
            return Err(Reply::err("syntax error"));
        }
        let pop: &'static [u8] = match (name, args[numkeys + 1].to_ascii_uppercase().as_slice()) {
            ("lmpop", b"LEFT") => b"LPOP",
            ("lmpop", b"RIGHT") => b"RPOP",
            ("zmpop", b"MIN") => b"ZPOPMIN",
            ("zmpop", b"MAX") => b"ZPOPMAX",
            _ => return Err(Reply::err("syntax error")),
        };
        let count = match &args[numkeys + 2..] {
            [] => 1,
            [word, n] if word.eq_ignore_ascii_case(b"COUNT") => parse_int(n)
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| Reply::err("count should be greater than 0"))?,
            _ => return Err(Reply::err("syntax error")),
        };
        for key in &args[1..=numkeys] {
            let command = vec![Bytes::from_static(pop), key.clone(), Bytes::from(count.to_string())];
            let popped = match self.run_data(command).await {
                Reply::Array(items) if !items.is_empty() => items,
                Reply::Array(_) | Reply::NullArray | Reply::Null => continue,
                other => return Err(other),
            };
            // ZMPOP pairs each member with its score.
            let items = if name == "zmpop" {
                popped.chunks(2).map(|pair| Reply::Array(pair.to_vec())).collect()
            } else {
                popped
            };
            return Ok(Some(Reply::Array(vec![Reply::Bulk(key.clone()), Reply::Array(items)])));
        }
        Ok(None)
    }

    /// A SORT lookup: `pattern` with its first `*` replaced by `element`, optionally
    /// `->field` of a hash; `#` is the element itself. `None` if absent or another type.
    async fn sort_lookup(&mut self, pattern: &Bytes, element: &Bytes) -> Result<Option<Bytes>, Reply> {
        if pattern.as_ref() == b"#" {
            return Ok(Some(element.clone()));
        }
        let Some(star) = pattern.iter().position(|b| *b == b'*') else { return Ok(None) };
        let arrow = pattern[star + 1..].windows(2).position(|w| w == b"->").map(|at| star + 1 + at);
        let (key_end, field) = match arrow {
            Some(at) if at + 2 < pattern.len() => (at, Some(pattern.slice(at + 2..))),
            _ => (pattern.len(), None),
        };
        let mut key = pattern[..star].to_vec();
        key.extend_from_slice(element);
        key.extend_from_slice(&pattern[star + 1..key_end]);
        Ok(match (self.read_entry(&Bytes::from(key)).await?, field) {
            (Some(Entry { value: Typed::String(value), .. }), None) => Some(value),
            (Some(Entry { value: Typed::Hash(fields), .. }), Some(field)) => {
                fields.iter().find(|(name, _)| *name == field).map(|(_, value)| value.clone())
            }
            _ => None,
        })
    }

    /// SORT key [BY pattern] [LIMIT offset count] [GET pattern...] [ASC|DESC] [ALPHA] [STORE dst].
    async fn sort(&mut self, name: &str, args: &[Bytes]) -> Result<Reply, Reply> {
        let (mut by, mut limit, mut gets, mut desc, mut alpha, mut store) =
            (None, None, Vec::new(), false, false, None);
        let mut at = 2;
        while at < args.len() {
            let word = args[at].to_ascii_uppercase();
            let has = |n: usize| at + n < args.len();
            match word.as_slice() {
                b"ASC" => desc = false,
                b"DESC" => desc = true,
                b"ALPHA" => alpha = true,
                b"BY" if has(1) => {
                    by = Some(args[at + 1].clone());
                    at += 1;
                }
                b"GET" if has(1) => {
                    gets.push(args[at + 1].clone());
                    at += 1;
                }
                b"LIMIT" if has(2) => {
                    let bad = |_| Reply::err("value is not an integer or out of range");
                    limit = Some((
                        parse_int(&args[at + 1]).map_err(bad)?,
                        parse_int(&args[at + 2]).map_err(bad)?,
                    ));
                    at += 2;
                }
                b"STORE" if has(1) && name == "sort" => {
                    store = Some(args[at + 1].clone());
                    at += 1;
                }
                _ => return Err(Reply::err("syntax error")),
            }
            at += 1;
        }
        let (elements, ordered) = match self.read_entry(&args[1]).await? {
            None => (Vec::new(), false),
            Some(Entry { value: Typed::List(items), .. }) => (items, false),
            Some(Entry { value: Typed::Set(members), .. }) => (members.into_iter().collect(), false),
            Some(Entry { value: Typed::ZSet(members), .. }) => {
                let mut all: Vec<(Bytes, f64)> = members.into_iter().collect();
                all.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
                (all.into_iter().map(|(m, _)| m).collect(), true)
            }
            Some(_) => return Err(Reply::error(WRONGTYPE)),
        };
        // BY without a `*` means "do not sort".
        let no_sort = by.as_ref().is_some_and(|pattern| !pattern.contains(&b'*'));
        let mut keyed = Vec::with_capacity(elements.len());
        for element in elements {
            let weight = match &by {
                Some(pattern) if !no_sort => self.sort_lookup(pattern, &element).await?,
                _ => Some(element.clone()),
            };
            keyed.push((element, weight));
        }
        if !no_sort {
            let mut scored = Vec::with_capacity(keyed.len());
            for (element, weight) in keyed {
                let score = match (&weight, alpha) {
                    (Some(text), false) => parse_float(text)
                        .map_err(|_| Reply::err("One or more scores can't be converted into double"))?,
                    _ => 0.0,
                };
                scored.push((element, weight, score));
            }
            scored.sort_by(|a, b| {
                let primary = if alpha { a.1.cmp(&b.1) } else { a.2.total_cmp(&b.2) };
                primary.then_with(|| a.0.cmp(&b.0))
            });
            if desc {
                scored.reverse();
            }
            keyed = scored.into_iter().map(|(element, weight, _)| (element, weight)).collect();
        } else if desc && ordered {
            keyed.reverse();
        }
        let page: Vec<Bytes> = match limit {
            Some((offset, count)) => {
                let start = offset.max(0) as usize;
                let count = if count < 0 { usize::MAX } else { count as usize };
                keyed.into_iter().skip(start).take(count).map(|(element, _)| element).collect()
            }
            None => keyed.into_iter().map(|(element, _)| element).collect(),
        };
        let mut out: Vec<Option<Bytes>> = Vec::new();
        for element in page {
            if gets.is_empty() {
                out.push(Some(element.clone()));
            }
            for pattern in &gets {
                out.push(self.sort_lookup(pattern, &element).await?);
            }
        }
        let Some(destination) = store else {
            return Ok(Reply::Array(out.into_iter().map(Reply::optional).collect()));
        };
        let count = out.len() as i64;
        let items = out.into_iter().map(Option::unwrap_or_default).collect();
        self.put_entry(destination, Some(&Entry { value: Typed::List(items), deadline_ms: None })).await?;
        Ok(Reply::Integer(count))
    }

    /// BITOP AND|OR|XOR|NOT dest key...: missing keys are empty strings, shorter ones padded
    /// with zero bytes, as in Redis.
    /// LCS `a b [LEN] [IDX] [MINMATCHLEN n] [WITHMATCHLEN]`: the two strings read one after
    /// the other (each linearizable, the pair not atomic, as MGET), compared as Redis does.
    async fn lcs(&mut self, args: &[Bytes]) -> Result<Reply, Reply> {
        let (mut get_len, mut get_idx, mut with_len, mut min_len) = (false, false, false, 0);
        let mut at = 3;
        while at < args.len() {
            match args[at].to_ascii_uppercase().as_slice() {
                b"LEN" => get_len = true,
                b"IDX" => get_idx = true,
                b"WITHMATCHLEN" => with_len = true,
                b"MINMATCHLEN" if at + 1 < args.len() => {
                    at += 1;
                    let n = parse_int(&args[at])
                        .map_err(|_| Reply::err("value is not an integer or out of range"))?;
                    min_len = usize::try_from(n).unwrap_or(0);
                }
                _ => return Err(Reply::err("syntax error")),
            }
            at += 1;
        }
        if get_len && get_idx {
            return Err(Reply::err("If you want both the length and indexes, please just use IDX."));
        }
        let mut strings = Vec::with_capacity(2);
        for key in &args[1..3] {
            match self.read_entry(key).await? {
                None => strings.push(Bytes::new()),
                Some(Entry { value: Typed::String(bytes), .. }) => strings.push(bytes),
                Some(_) => return Err(Reply::error(WRONGTYPE)),
            }
        }
        let (string, matches) = chorus_core::data::lcs::lcs(&strings[0], &strings[1])
            .ok_or_else(|| Reply::err("LCS of strings this long would need more than 1 GiB"))?;
        if get_len {
            return Ok(Reply::Integer(string.len() as i64));
        }
        if !get_idx {
            return Ok(Reply::Bulk(Bytes::from(string)));
        }
        let range = |(start, end): (usize, usize)| {
            Reply::Array(vec![Reply::Integer(start as i64), Reply::Integer(end as i64)])
        };
        let ranges = matches
            .iter()
            .filter(|run| run.length() >= min_len)
            .map(|run| {
                let mut item = vec![range(run.a), range(run.b)];
                if with_len {
                    item.push(Reply::Integer(run.length() as i64));
                }
                Reply::Array(item)
            })
            .collect();
        Ok(Reply::Map(vec![
            (Reply::text("matches"), Reply::Array(ranges)),
            (Reply::text("len"), Reply::Integer(string.len() as i64)),
        ]))
    }

    async fn bitop(&mut self, args: &[Bytes]) -> Result<Reply, Reply> {
        let op = args[1].to_ascii_uppercase();
        if !matches!(op.as_slice(), b"AND" | b"OR" | b"XOR" | b"NOT") {
            return Err(Reply::err("syntax error"));
        }
        if op.as_slice() == b"NOT" && args.len() != 4 {
            return Err(Reply::err("BITOP NOT must be called with a single source key."));
        }
        let mut sources = Vec::new();
        for key in &args[3..] {
            match self.read_entry(key).await? {
                None => sources.push(Bytes::new()),
                Some(Entry { value: Typed::String(bytes), .. }) => sources.push(bytes),
                Some(_) => return Err(Reply::error(WRONGTYPE)),
            }
        }
        let len = sources.iter().map(|s| s.len()).max().unwrap_or(0);
        let byte = |source: &Bytes, at: usize| source.get(at).copied().unwrap_or(0);
        let result: Vec<u8> = (0..len)
            .map(|at| {
                let mut bytes = sources.iter().map(|source| byte(source, at));
                let first = bytes.next().unwrap_or(0);
                match op.as_slice() {
                    b"AND" => bytes.fold(first, |acc, b| acc & b),
                    b"OR" => bytes.fold(first, |acc, b| acc | b),
                    b"XOR" => bytes.fold(first, |acc, b| acc ^ b),
                    _ => !first,
                }
            })
            .collect();
        let entry = (!result.is_empty())
            .then(|| Entry { value: Typed::String(Bytes::from(result)), deadline_ms: None });
        self.put_entry(args[2].clone(), entry.as_ref()).await?;
        Ok(Reply::Integer(len as i64))
    }

    /// A HyperLogLog's registers, with the key's entry (`None`: absent, no registers).
    async fn read_hll(&mut self, key: &Bytes) -> Result<Option<(Entry, hll::Registers)>, Reply> {
        match self.read_entry(key).await? {
            None => Ok(None),
            Some(entry) => match &entry.value {
                Typed::String(bytes) => {
                    let registers = hll::Registers::decode(bytes).map_err(Reply::error)?;
                    Ok(Some((entry, registers)))
                }
                _ => Err(Reply::error(WRONGTYPE)),
            },
        }
    }

    /// PFCOUNT of several keys: the count of their union (one read per key).
    async fn pfcount(&mut self, keys: &[Bytes]) -> Result<Reply, Reply> {
        let mut union = hll::Registers::default();
        for key in keys {
            if let Some((_, registers)) = self.read_hll(key).await? {
                union.merge(&registers);
            }
        }
        Ok(Reply::Integer(union.count() as i64))
    }

    /// PFMERGE dst src...: the union of the destination and the sources written to the
    /// destination, which keeps its deadline.
    async fn pfmerge(&mut self, args: &[Bytes]) -> Result<Reply, Reply> {
        let (mut union, mut deadline_ms) = (hll::Registers::default(), None);
        if let Some((entry, registers)) = self.read_hll(&args[1]).await? {
            union = registers;
            deadline_ms = entry.deadline_ms;
        }
        for key in &args[2..] {
            if let Some((_, registers)) = self.read_hll(key).await? {
                union.merge(&registers);
            }
        }
        let entry = Entry { value: Typed::String(union.encode()), deadline_ms };
        self.put_entry(args[1].clone(), Some(&entry)).await?;
        Ok(Reply::ok())
    }

    /// GEOSEARCHSTORE dst src ... [STOREDIST], GEORADIUS[BYMEMBER] ... STORE|STOREDIST dst:
    /// the search on the source's sorted set, then one write of the destination.
    async fn geo_store(&mut self, name: &str, args: &[Bytes]) -> Result<Reply, Reply> {
        let (mut search, mut destination, mut store_dist) = (Vec::new(), None, false);
        if name == "geosearchstore" {
            destination = Some(args[1].clone());
            search.push(Bytes::from_static(b"GEOSEARCH"));
            search.push(args[2].clone());
            for arg in &args[3..] {
                if arg.eq_ignore_ascii_case(b"STOREDIST") {
                    store_dist = true;
                } else {
                    search.push(arg.clone());
                }
            }
        } else {
            let mut at = 0;
            while at < args.len() {
                let word = args[at].to_ascii_uppercase();
                if (word.as_slice() == b"STORE" || word.as_slice() == b"STOREDIST") && at + 1 < args.len() {
                    store_dist = word.as_slice() == b"STOREDIST";
                    destination = Some(args[at + 1].clone());
                    at += 2;
                    continue;
                }
                search.push(args[at].clone());
                at += 1;
            }
        }
        let destination = destination.ok_or_else(|| Reply::err("syntax error"))?;
        if search.len() < 2 {
            return Err(Reply::err("syntax error"));
        }
        let members = self.read_scored(&search[1]).await?;
        let found = chorus_core::data::geo::search_members(&search, &members).map_err(Reply::Error)?;
        let stored: BTreeMap<Bytes, f64> = found
            .into_iter()
            .map(|(member, distance, score)| (member, if store_dist { distance } else { score }))
            .collect();
        let count = stored.len() as i64;
        self.put_entry(destination, Some(&Entry { value: Typed::ZSet(stored), deadline_ms: None })).await?;
        Ok(Reply::Integer(count))
    }

    /// ZRANGESTORE dst src min max [BYSCORE|BYLEX] [REV] [LIMIT offset count]: the ZRANGE,
    /// then the members' scores, then one write.
    async fn zrangestore(&mut self, args: &[Bytes]) -> Result<Reply, Reply> {
        let mut range = vec![Bytes::from_static(b"ZRANGE")];
        range.extend(args[2..].iter().cloned());
        let members = match self.run_data(range).await {
            Reply::Array(members) => members,
            other => return Err(other),
        };
        let scores = self.read_scored(&args[2]).await?;
        let stored: BTreeMap<Bytes, f64> = members
            .into_iter()
            .filter_map(|member| match member {
                Reply::Bulk(member) => scores.get(&member).map(|score| (member, *score)),
                _ => None,
            })
            .collect();
        let count = stored.len() as i64;
        self.put_entry(args[1].clone(), Some(&Entry { value: Typed::ZSet(stored), deadline_ms: None }))
            .await?;
        Ok(Reply::Integer(count))
    }
}

/// Names of the commands [`Connection::multikey`] runs.
pub const COMMANDS: &[&str] = &[
    "xread",
    "xreadgroup",
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
    "blmpop",
    "bzmpop",
    "lmpop",
    "zmpop",
    "sort",
    "sort_ro",
    "bitop",
    "pfmerge",
    "lcs",
    "geosearchstore",
    "zrangestore",
];
