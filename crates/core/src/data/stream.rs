//! Streams (XADD, XRANGE, XREAD, consumer groups, ...), stored like every other type: one
//! value per key, changed by one replicated read-modify-write.
//!
//! Everything a stream command decides from the clock (an auto-generated ID, a delivery
//! time, a consumer's idle time) comes from the op's `now_ms`, the coordinating replica's
//! clock reading that travels with the op, so every replica computes the same IDs. A new
//! ID is never below the stream's last one, whatever the clock does (Redis does the same).
//!
//! Layout after `STREAM_MAGIC`: last ID, max deleted ID, entries added, the entries
//! (ID, field/value pairs), then the groups (name, last delivered ID, entries read, the
//! pending entries list, the consumers). IDs are two u64s.

use std::collections::BTreeMap;

use bytes::{BufMut, Bytes, BytesMut};

use super::{syntax_error, Args, Data, Fail, Reply, Slot};
use crate::codec::{DecodeError, Reader, WriteExt};

/// A stream entry ID: milliseconds, then a sequence number.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct StreamId {
    pub ms: u64,
    pub seq: u64,
}

impl StreamId {
    const MAX: StreamId = StreamId { ms: u64::MAX, seq: u64::MAX };
    const ZERO: StreamId = StreamId { ms: 0, seq: 0 };

    fn text(self) -> Bytes {
        Bytes::from(format!("{}-{}", self.ms, self.seq))
    }
    fn data(self) -> Data {
        Data::Bulk(self.text())
    }
    fn next(self) -> Option<StreamId> {
        match self.seq.checked_add(1) {
            Some(seq) => Some(StreamId { ms: self.ms, seq }),
            None => self.ms.checked_add(1).map(|ms| StreamId { ms, seq: 0 }),
        }
    }
    fn previous(self) -> Option<StreamId> {
        match self.seq.checked_sub(1) {
            Some(seq) => Some(StreamId { ms: self.ms, seq }),
            None => self.ms.checked_sub(1).map(|ms| StreamId { ms, seq: u64::MAX }),
        }
    }
}

/// One entry of a group's pending entries list: delivered, not yet acknowledged.
#[derive(Clone, Debug, PartialEq)]
pub struct Pending {
    pub consumer: Bytes,
    pub delivered_ms: u64,
    pub deliveries: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Consumer {
    pub seen_ms: u64,
    /// When it last read or claimed something; `None`: never.
    pub active_ms: Option<u64>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    pub last_id: StreamId,
    /// Entries the group read, if known (Redis' `entries-read`, for `lag`).
    pub entries_read: Option<u64>,
    pub pending: BTreeMap<StreamId, Pending>,
    pub consumers: BTreeMap<Bytes, Consumer>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stream {
    pub entries: BTreeMap<StreamId, Vec<(Bytes, Bytes)>>,
    pub last_id: StreamId,
    pub max_deleted: StreamId,
    pub entries_added: u64,
    pub groups: BTreeMap<Bytes, Group>,
}

// ------------------------------------------------------------------------------ encoding

fn put_id(buf: &mut BytesMut, id: StreamId) {
    buf.put_u64_le(id.ms);
    buf.put_u64_le(id.seq);
}

fn read_id(reader: &mut Reader) -> Result<StreamId, DecodeError> {
    Ok(StreamId { ms: reader.u64()?, seq: reader.u64()? })
}

fn put_count(buf: &mut BytesMut, count: usize) {
    buf.put_u32_le(u32::try_from(count).expect("stream part over u32 elements"));
}

/// The stream's body (after the type tag).
pub fn encode(stream: &Stream, buf: &mut BytesMut) {
    put_id(buf, stream.last_id);
    put_id(buf, stream.max_deleted);
    buf.put_u64_le(stream.entries_added);
    put_count(buf, stream.entries.len());
    for (id, fields) in &stream.entries {
        put_id(buf, *id);
        put_count(buf, fields.len());
        for (field, value) in fields {
            buf.put_bytes_prefixed(field);
            buf.put_bytes_prefixed(value);
        }
    }
    put_count(buf, stream.groups.len());
    for (name, group) in &stream.groups {
        buf.put_bytes_prefixed(name);
        put_id(buf, group.last_id);
        buf.put_u64_le(group.entries_read.map_or(u64::MAX, |read| read));
        put_count(buf, group.pending.len());
        for (id, pending) in &group.pending {
            put_id(buf, *id);
            buf.put_bytes_prefixed(&pending.consumer);
            buf.put_u64_le(pending.delivered_ms);
            buf.put_u64_le(pending.deliveries);
        }
        put_count(buf, group.consumers.len());
        for (name, consumer) in &group.consumers {
            buf.put_bytes_prefixed(name);
            buf.put_u64_le(consumer.seen_ms);
            buf.put_u64_le(consumer.active_ms.map_or(u64::MAX, |at| at));
        }
    }
}

pub fn decode(body: Bytes) -> Result<Stream, DecodeError> {
    let mut reader = Reader::new(body);
    let last_id = read_id(&mut reader)?;
    let max_deleted = read_id(&mut reader)?;
    let entries_added = reader.u64()?;
    let entries = reader.list(|reader| {
        let id = read_id(reader)?;
        Ok((id, reader.list(|reader| Ok((reader.bytes()?, reader.bytes()?)))?))
    })?;
    let groups = reader.list(|reader| {
        let name = reader.bytes()?;
        let last_id = read_id(reader)?;
        let entries_read = Some(reader.u64()?).filter(|read| *read != u64::MAX);
        let pending = reader.list(|reader| {
            let id = read_id(reader)?;
            let consumer = reader.bytes()?;
            Ok((id, Pending { consumer, delivered_ms: reader.u64()?, deliveries: reader.u64()? }))
        })?;
        let consumers = reader.list(|reader| {
            let name = reader.bytes()?;
            let seen_ms = reader.u64()?;
            let active_ms = Some(reader.u64()?).filter(|at| *at != u64::MAX);
            Ok((name, Consumer { seen_ms, active_ms }))
        })?;
        let group = Group {
            last_id,
            entries_read,
            pending: pending.into_iter().collect(),
            consumers: consumers.into_iter().collect(),
        };
        Ok((name, group))
    })?;
    reader.finish()?;
    Ok(Stream {
        entries: entries.into_iter().collect(),
        last_id,
        max_deleted,
        entries_added,
        groups: groups.into_iter().collect(),
    })
}

// ------------------------------------------------------------------------------ commands

pub(super) fn run(name: &str, args: &Args, slot: &mut Slot) -> Option<Reply> {
    Some(match name {
        "xadd" => xadd(args, slot),
        "xlen" => read(slot, |stream| Ok(Data::Integer(stream.map_or(0, |s| s.entries.len() as i64)))),
        "xrange" | "xrevrange" => xrange(name == "xrevrange", args, slot),
        "xdel" => xdel(args, slot),
        "xtrim" => xtrim(args, slot),
        "xsetid" => xsetid(args, slot),
        "xread" => xread(args, slot),
        "xgroup" => xgroup(args, slot),
        "xreadgroup" => xreadgroup(args, slot),
        "xack" => xack(args, slot),
        "xpending" => xpending(args, slot),
        "xclaim" => xclaim(args, slot),
        "xautoclaim" => xautoclaim(args, slot),
        "xinfo" => xinfo(args, slot),
        _ => return None,
    })
}

fn read(slot: &Slot, reply: impl FnOnce(Option<&Stream>) -> Reply) -> Reply {
    reply(slot.stream()?.map(|stream| &**stream))
}

fn invalid_id() -> Fail {
    "ERR Invalid stream ID specified as stream command argument".into()
}

/// `ms-seq`, or `ms` with `missing_seq` as the sequence; `-` and `+` are the extremes.
fn parse_id(arg: &[u8], missing_seq: u64) -> Result<StreamId, Fail> {
    match arg {
        b"-" => return Ok(StreamId::ZERO),
        b"+" => return Ok(StreamId::MAX),
        _ => {}
    }
    let text = std::str::from_utf8(arg).map_err(|_| invalid_id())?;
    let number = |part: &str| part.parse::<u64>().map_err(|_| invalid_id());
    match text.split_once('-') {
        Some((ms, seq)) => Ok(StreamId { ms: number(ms)?, seq: number(seq)? }),
        None => Ok(StreamId { ms: number(text)?, seq: missing_seq }),
    }
}

/// A range bound: inclusive, or exclusive with `(` (the next or previous ID).
fn parse_bound(arg: &[u8], start: bool) -> Result<Option<StreamId>, Fail> {
    let missing_seq = if start { 0 } else { u64::MAX };
    match arg.strip_prefix(b"(") {
        Some(rest) if rest == b"-" || rest == b"+" => Err(invalid_id()),
        Some(rest) => {
            let id = parse_id(rest, missing_seq)?;
            Ok(if start { id.next() } else { id.previous() })
        }
        None => parse_id(arg, missing_seq).map(Some),
    }
}

fn entry_data(id: StreamId, fields: &[(Bytes, Bytes)]) -> Data {
    let flat = fields.iter().flat_map(|(field, value)| [field.clone(), value.clone()]);
    Data::Array(vec![id.data(), Data::bulks(flat)])
}

fn positive(args: &Args, at: usize) -> Result<u64, Fail> {
    u64::try_from(args.int(at)?).map_err(|_| "ERR value is out of range, must be positive".to_string())
}

/// How to trim: MAXLEN or MINID, exact or approximate (`~`), and LIMIT.
#[derive(Clone, Copy)]
enum Threshold {
    MaxLen(u64),
    MinId(StreamId),
}

#[derive(Clone, Copy)]
struct Trim {
    threshold: Threshold,
    approximate: bool,
    limit: Option<u64>,
}

/// Entries per radix-tree node (Redis' `stream-node-max-entries`): approximate trimming only
/// removes whole nodes, so it removes entries in multiples of this.
const NODE_ENTRIES: u64 = 100;

/// Parse `MAXLEN|MINID [=|~] threshold [LIMIT count]` at `args[at..]`; returns where it ended.
fn parse_trim(args: &Args, mut at: usize) -> Result<(Trim, usize), Fail> {
    let kind = args.word(at);
    at += 1;
    let mut approximate = false;
    if at < args.len() && (args.get(at).as_ref() == b"~" || args.get(at).as_ref() == b"=") {
        approximate = args.get(at).as_ref() == b"~";
        at += 1;
    }
    if at >= args.len() {
        return Err(syntax_error());
    }
    let threshold = match kind.as_str() {
        "MAXLEN" => Threshold::MaxLen(positive(args, at)?),
        _ => Threshold::MinId(parse_id(args.get(at), 0)?),
    };
    at += 1;
    let mut limit = None;
    if at + 1 < args.len() && args.word(at) == "LIMIT" {
        if !approximate {
            return Err("ERR syntax error, LIMIT cannot be used without the special ~ option".into());
        }
        limit = Some(positive(args, at + 1)?);
        at += 2;
    }
    Ok((Trim { threshold, approximate, limit }, at))
}

/// Remove entries from the head as `trim` says; returns how many. Approximate trimming
/// removes whole nodes only, as Redis does: a node goes if what remains still meets the
/// threshold (MAXLEN) or its last entry is below it (MINID), and stops at LIMIT (default 100
/// nodes' worth). Nodes are modelled as runs of `NODE_ENTRIES` counted from the newest entry
/// (the tail node is the partly filled one), which keeps the result deterministic.
fn apply_trim(stream: &mut Stream, trim: Trim) -> u64 {
    let length = stream.entries.len() as u64;
    let excess = match trim.threshold {
        Threshold::MaxLen(max) => length.saturating_sub(max),
        Threshold::MinId(min) => stream.entries.range(..min).count() as u64,
    };
    let removed = if trim.approximate {
        let limit = trim.limit.unwrap_or(NODE_ENTRIES * 100);
        let tail_node = match length % NODE_ENTRIES {
            0 => NODE_ENTRIES,
            partial => partial,
        };
        let mut removed = 0;
        while removed < length {
            let node = if length - removed == tail_node { tail_node } else { NODE_ENTRIES };
            if removed + node > excess || removed + node > limit {
                break;
            }
            removed += node;
        }
        removed
    } else {
        excess
    };
    for _ in 0..removed {
        stream.entries.pop_first();
    }
    removed
}

fn xadd(args: &Args, slot: &mut Slot) -> Reply {
    let mut at = 2;
    let mut make_stream = true;
    let mut trim = None;
    loop {
        if at >= args.len() {
            return Err(syntax_error());
        }
        match args.word(at).as_str() {
            "NOMKSTREAM" => {
                make_stream = false;
                at += 1;
            }
            "MAXLEN" | "MINID" => {
                let (parsed, next) = parse_trim(args, at)?;
                trim = Some(parsed);
                at = next;
            }
            "LIMIT" => {
                return Err(
                    "ERR syntax error, LIMIT cannot be used without specifying a trimming strategy".into()
                )
            }
            _ => break,
        }
    }
    let fields = args.from(at + 1);
    if fields.is_empty() || !fields.len().is_multiple_of(2) {
        return Err("ERR wrong number of arguments for 'xadd' command".into());
    }
    let requested = args.get(at).clone();
    if slot.stream()?.is_none() && !make_stream {
        return Ok(Data::Nil);
    }
    let now_ms = slot.now_ms();
    let stream = slot.stream_mut()?;
    let id = new_id(stream, &requested, now_ms)?;
    let pairs = fields.chunks(2).map(|pair| (pair[0].clone(), pair[1].clone())).collect();
    stream.entries.insert(id, pairs);
    stream.last_id = id;
    stream.entries_added += 1;
    if let Some(trim) = trim {
        apply_trim(stream, trim);
    }
    Ok(id.data())
}

/// The ID an XADD gets: `*` (the clock, never below the last ID), `ms-*`, or explicit.
fn new_id(stream: &Stream, requested: &[u8], now_ms: u64) -> Result<StreamId, Fail> {
    let last = stream.last_id;
    let exhausted =
        || Fail::from("ERR The stream has exhausted the last possible ID, unable to add more items");
    let too_small =
        || Fail::from("ERR The ID specified in XADD is equal or smaller than the target stream top item");
    if requested == b"*" {
        return if now_ms > last.ms {
            Ok(StreamId { ms: now_ms, seq: 0 })
        } else {
            last.next().ok_or_else(exhausted)
        };
    }
    let id = match requested.strip_suffix(b"-*") {
        Some(ms) => {
            let ms = parse_id(ms, 0)?.ms;
            if ms == last.ms && last != StreamId::ZERO {
                StreamId { ms, seq: last.seq.checked_add(1).ok_or_else(too_small)? }
            } else {
                StreamId { ms, seq: if ms == 0 { 1 } else { 0 } }
            }
        }
        None => parse_id(requested, 0)?,
    };
    if id == StreamId::ZERO {
        return Err("ERR The ID specified in XADD must be greater than 0-0".into());
    }
    if id <= last {
        return Err(too_small());
    }
    Ok(id)
}

fn xrange(reverse: bool, args: &Args, slot: &Slot) -> Reply {
    let (low, high) = if reverse { (args.get(3), args.get(2)) } else { (args.get(2), args.get(3)) };
    let (low, high) = (parse_bound(low, true)?, parse_bound(high, false)?);
    let count = match args.len() {
        4 => None,
        6 if args.word(4) == "COUNT" => Some(args.int(5)?.max(0) as usize),
        _ => return Err(syntax_error()),
    };
    let Some(stream) = slot.stream()? else { return Ok(Data::Array(Vec::new())) };
    let (Some(low), Some(high)) = (low, high) else { return Ok(Data::Array(Vec::new())) };
    if low > high || count == Some(0) {
        return Ok(Data::Array(Vec::new()));
    }
    let range = stream.entries.range(low..=high);
    let take = count.unwrap_or(usize::MAX);
    let entries: Vec<Data> = if reverse {
        range.rev().take(take).map(|(id, fields)| entry_data(*id, fields)).collect()
    } else {
        range.take(take).map(|(id, fields)| entry_data(*id, fields)).collect()
    };
    Ok(Data::Array(entries))
}

fn xdel(args: &Args, slot: &mut Slot) -> Reply {
    let ids = args.from(2).iter().map(|arg| parse_id(arg, 0)).collect::<Result<Vec<_>, _>>()?;
    if slot.stream()?.is_none() {
        return Ok(Data::Integer(0));
    }
    let stream = slot.stream_mut()?;
    let mut deleted = 0;
    for id in ids {
        if stream.entries.remove(&id).is_some() {
            deleted += 1;
            stream.max_deleted = stream.max_deleted.max(id);
        }
    }
    Ok(Data::Integer(deleted))
}

fn xtrim(args: &Args, slot: &mut Slot) -> Reply {
    let kind = args.word(2);
    if kind != "MAXLEN" && kind != "MINID" {
        return Err(syntax_error());
    }
    let (trim, end) = parse_trim(args, 2)?;
    if end != args.len() {
        return Err(syntax_error());
    }
    if slot.stream()?.is_none() {
        return Ok(Data::Integer(0));
    }
    Ok(Data::Integer(apply_trim(slot.stream_mut()?, trim) as i64))
}

/// An ID given in full or as `ms` (`-`, `+` and `*` are refused), as XSETID reads them.
fn parse_strict_id(arg: &[u8]) -> Result<StreamId, Fail> {
    match arg {
        b"-" | b"+" | b"*" => Err(invalid_id()),
        _ => parse_id(arg, 0),
    }
}

/// `XSETID key last-id [ENTRIESADDED n] [MAXDELETEDID id]` with Redis 7.0's checks and
/// errors: the stream's last ID (what `*` grows from) set by hand.
fn xsetid(args: &Args, slot: &mut Slot) -> Reply {
    let last_id = parse_strict_id(args.get(2))?;
    let (mut entries_added, mut max_deleted) = (None, None);
    let mut at = 3;
    while at < args.len() {
        match args.word(at).as_str() {
            "ENTRIESADDED" if at + 1 < args.len() => {
                let added = args.int(at + 1)?;
                entries_added = Some(u64::try_from(added).map_err(|_| "ERR entries_added must be positive")?);
            }
            "MAXDELETEDID" if at + 1 < args.len() => {
                let id = parse_strict_id(args.get(at + 1))?;
                if last_id < id {
                    return Err(
                        "ERR The ID specified in XSETID is smaller than the provided max_deleted_entry_id"
                            .into(),
                    );
                }
                max_deleted = Some(id);
            }
            _ => return Err(syntax_error()),
        }
        at += 2;
    }
    if slot.stream()?.is_none() {
        return Err("ERR no such key".into());
    }
    let stream = slot.stream_mut()?;
    if let Some(top) = stream.entries.keys().next_back() {
        if last_id < *top {
            return Err("ERR The ID specified in XSETID is smaller than the target stream top item".into());
        }
        if entries_added.is_some_and(|added| added < stream.entries.len() as u64) {
            return Err(
                "ERR The entries_added specified in XSETID is smaller than the target stream length".into()
            );
        }
    }
    stream.last_id = last_id;
    if let Some(added) = entries_added {
        stream.entries_added = added;
    }
    if let Some(id) = max_deleted.filter(|id| *id != StreamId::ZERO) {
        stream.max_deleted = id;
    }
    Ok(Data::ok())
}

/// `[COUNT n] [BLOCK ms] [NOACK] STREAMS key id` for one key (the server splits several
/// keys into one op each): the count, NOACK, and the ID argument.
fn read_options(args: &Args, from: usize, group: bool) -> Result<(Option<usize>, bool, Bytes), Fail> {
    let (mut count, mut noack, mut at) = (None, false, from);
    while at < args.len() {
        match args.word(at).as_str() {
            "COUNT" if at + 1 < args.len() => {
                count = Some(args.int(at + 1)?.max(0) as usize).filter(|count| *count > 0);
                at += 2;
            }
            "BLOCK" if at + 1 < args.len() => {
                if args.int(at + 1)? < 0 {
                    return Err("ERR timeout is negative".into());
                }
                at += 2;
            }
            "NOACK" if group => {
                noack = true;
                at += 1;
            }
            "STREAMS" if at + 3 == args.len() => return Ok((count, noack, args.get(at + 2).clone())),
            "STREAMS" => return Err(
                "ERR Unbalanced 'xread' list of streams: for each stream key an ID or '$' must be specified."
                    .into(),
            ),
            _ => return Err(syntax_error()),
        }
    }
    Err(syntax_error())
}

/// XREAD over one key: its entries after the ID (`$`: none), or nil.
fn xread(args: &Args, slot: &Slot) -> Reply {
    let (count, _, id) = read_options(args, 1, false)?;
    let stream = slot.stream()?;
    let after = match id.as_ref() {
        b"$" => return Ok(Data::NilArray),
        b"+" => match stream.and_then(|s| s.entries.last_key_value()) {
            Some((last, fields)) => return Ok(Data::Array(vec![entry_data(*last, fields)])),
            None => return Ok(Data::NilArray),
        },
        other => parse_id(other, 0)?,
    };
    let Some(stream) = stream else { return Ok(Data::NilArray) };
    let Some(from) = after.next() else { return Ok(Data::NilArray) };
    let entries: Vec<Data> = stream
        .entries
        .range(from..)
        .take(count.unwrap_or(usize::MAX))
        .map(|(id, fields)| entry_data(*id, fields))
        .collect();
    Ok(if entries.is_empty() { Data::NilArray } else { Data::Array(entries) })
}

fn no_group(key: &[u8], group: &[u8]) -> Fail {
    format!(
        "NOGROUP No such key '{}' or consumer group '{}'",
        String::from_utf8_lossy(key),
        String::from_utf8_lossy(group)
    )
}

fn group_mut<'a>(stream: &'a mut Stream, key: &[u8], name: &[u8]) -> Result<&'a mut Group, Fail> {
    stream.groups.get_mut(name).ok_or_else(|| no_group(key, name))
}

/// A group's start: `$` is the stream's last ID.
fn group_start(stream: &Stream, arg: &[u8]) -> Result<StreamId, Fail> {
    if arg == b"$" {
        Ok(stream.last_id)
    } else {
        parse_id(arg, 0)
    }
}

fn entries_read_option(args: &Args, at: usize) -> Result<Option<u64>, Fail> {
    match args.len() - at {
        0 => Ok(None),
        2 if args.word(at) == "ENTRIESREAD" => {
            let read = args.int(at + 1)?;
            if read < 0 && read != -1 {
                return Err("ERR value for ENTRIESREAD must be positive or -1".into());
            }
            Ok(u64::try_from(read).ok())
        }
        _ => Err(syntax_error()),
    }
}

fn xgroup(args: &Args, slot: &mut Slot) -> Reply {
    let sub = args.word(1);
    let key = args.get(2).clone();
    let needs = |count: usize| if args.len() < count { Err(super::arity("xgroup")) } else { Ok(()) };
    match sub.as_str() {
        "CREATE" => {
            needs(5)?;
            let (mut at, mut make_stream) = (5, false);
            if at < args.len() && args.word(at) == "MKSTREAM" {
                make_stream = true;
                at += 1;
            }
            let entries_read = entries_read_option(args, at)?;
            if slot.stream()?.is_none() && !make_stream {
                return Err("ERR The XGROUP subcommand requires the key to exist. Note that for CREATE you may want to use the MKSTREAM option to create an empty stream automatically.".into());
            }
            let stream = slot.stream_mut()?;
            let last_id = group_start(stream, args.get(4))?;
            if stream.groups.contains_key(args.get(3)) {
                return Err("BUSYGROUP Consumer Group name already exists".into());
            }
            let group = Group { last_id, entries_read, pending: BTreeMap::new(), consumers: BTreeMap::new() };
            stream.groups.insert(args.get(3).clone(), group);
            Ok(Data::ok())
        }
        "SETID" => {
            needs(5)?;
            let entries_read = entries_read_option(args, 5)?;
            let stream = existing(slot, &key)?;
            let last_id = group_start(stream, args.get(4))?;
            let group = stream.groups.get_mut(args.get(3)).ok_or_else(|| no_group(&key, args.get(3)))?;
            group.last_id = last_id;
            group.entries_read = entries_read;
            Ok(Data::ok())
        }
        "DESTROY" => {
            needs(4)?;
            let stream = existing(slot, &key)?;
            Ok(Data::Integer(stream.groups.remove(args.get(3)).is_some() as i64))
        }
        "CREATECONSUMER" => {
            needs(5)?;
            let now_ms = slot.now_ms();
            let group = group_mut(existing(slot, &key)?, &key, args.get(3))?;
            if group.consumers.contains_key(args.get(4)) {
                return Ok(Data::Integer(0));
            }
            group.consumers.insert(args.get(4).clone(), Consumer { seen_ms: now_ms, active_ms: None });
            Ok(Data::Integer(1))
        }
        "DELCONSUMER" => {
            needs(5)?;
            let group = group_mut(existing(slot, &key)?, &key, args.get(3))?;
            let consumer = args.get(4);
            if group.consumers.remove(consumer).is_none() {
                return Ok(Data::Integer(0));
            }
            let before = group.pending.len();
            group.pending.retain(|_, pending| pending.consumer != consumer);
            Ok(Data::Integer((before - group.pending.len()) as i64))
        }
        "HELP" => Ok(Data::bulks(
            [
                "XGROUP CREATE",
                "XGROUP SETID",
                "XGROUP DESTROY",
                "XGROUP CREATECONSUMER",
                "XGROUP DELCONSUMER",
            ]
            .map(|line| Bytes::from_static(line.as_bytes())),
        )),
        _ => Err(format!("ERR unknown subcommand '{sub}'. Try XGROUP HELP.")),
    }
}

/// The stream at the key, for a command that needs one to exist.
fn existing<'a>(slot: &'a mut Slot, key: &[u8]) -> Result<&'a mut Stream, Fail> {
    if slot.stream()?.is_none() {
        return Err(format!(
            "ERR The XGROUP subcommand requires the key to exist. Note that for CREATE you may want to use the MKSTREAM option to create an empty stream automatically. (key '{}')",
            String::from_utf8_lossy(key)
        ));
    }
    slot.stream_mut().map(|stream| &mut **stream)
}

/// The consumer, created if new, marked seen (and active if it reads or claims).
fn touch_consumer(group: &mut Group, name: &Bytes, now_ms: u64, active: bool) {
    let consumer =
        group.consumers.entry(name.clone()).or_insert(Consumer { seen_ms: now_ms, active_ms: None });
    consumer.seen_ms = now_ms;
    if active {
        consumer.active_ms = Some(now_ms);
    }
}

/// Whether an XDEL'd ID lies at or after `from`: the group's read counter cannot be derived.
fn has_tombstones_after(stream: &Stream, from: StreamId) -> bool {
    !stream.entries.is_empty() && stream.max_deleted != StreamId::ZERO && from <= stream.max_deleted
}

/// How many entries were ever added up to `id`, if that can be known (Redis'
/// `streamEstimateDistanceFromFirstEverEntry`).
fn entries_read_up_to(stream: &Stream, id: StreamId) -> Option<u64> {
    if stream.entries_added == 0 {
        return Some(0);
    }
    if stream.entries.is_empty() && id <= stream.last_id {
        return Some(stream.entries_added);
    }
    if id == stream.last_id {
        return Some(stream.entries_added);
    }
    if id > stream.last_id {
        return None;
    }
    let first = stream.entries.first_key_value().map_or(StreamId::ZERO, |(first, _)| *first);
    if stream.max_deleted == StreamId::ZERO || stream.max_deleted < first {
        let length = stream.entries.len() as u64;
        if id < first {
            return Some(stream.entries_added - length);
        }
        if id == first {
            return Some(stream.entries_added - length + 1);
        }
    }
    None
}

/// How many entries the group has not read yet, if known.
fn lag(stream: &Stream, group: &Group) -> Option<u64> {
    if stream.entries_added == 0 {
        return Some(0);
    }
    match group.entries_read {
        Some(read) if !has_tombstones_after(stream, group.last_id) => {
            Some(stream.entries_added.wrapping_sub(read))
        }
        _ => entries_read_up_to(stream, group.last_id).map(|read| stream.entries_added - read),
    }
}

fn xreadgroup(args: &Args, slot: &mut Slot) -> Reply {
    if args.word(1) != "GROUP" {
        return Err(syntax_error());
    }
    let (group_name, consumer) = (args.get(2).clone(), args.get(3).clone());
    let (count, noack, id) = read_options(args, 4, true)?;
    let key = super::key_of_stream_read(args.all).clone();
    let now_ms = slot.now_ms();
    let missing = || {
        format!(
            "NOGROUP No such key '{}' or consumer group '{}' in XREADGROUP with GROUP option",
            String::from_utf8_lossy(&key),
            String::from_utf8_lossy(&group_name)
        )
    };
    if slot.stream()?.is_none_or(|stream| !stream.groups.contains_key(&group_name)) {
        return Err(missing());
    }
    let stream = slot.stream_mut()?;
    let take = count.unwrap_or(usize::MAX);
    if id.as_ref() == b">" {
        let last = stream.groups[&group_name].last_id;
        let Some(from) = last.next() else { return Ok(Data::NilArray) };
        let delivered: Vec<StreamId> = stream.entries.range(from..).take(take).map(|(id, _)| *id).collect();
        let mut replies = Vec::with_capacity(delivered.len());
        for id in delivered {
            let entries_read = match stream.groups[&group_name].entries_read {
                Some(read) if !has_tombstones_after(stream, id) => Some(read + 1),
                _ => entries_read_up_to(stream, id),
            };
            replies.push(entry_data(id, &stream.entries[&id]));
            let group = stream.groups.get_mut(&group_name).expect("checked above");
            group.entries_read = entries_read;
            group.last_id = id;
            if !noack {
                group
                    .pending
                    .insert(id, Pending { consumer: consumer.clone(), delivered_ms: now_ms, deliveries: 1 });
            }
        }
        let group = stream.groups.get_mut(&group_name).expect("checked above");
        touch_consumer(group, &consumer, now_ms, !replies.is_empty());
        return Ok(if replies.is_empty() { Data::NilArray } else { Data::Array(replies) });
    }
    // History: this consumer's pending entries after the ID; deleted ones answer nil.
    let after = parse_id(&id, 0)?;
    let entries = &stream.entries;
    let group = stream.groups.get_mut(&group_name).expect("checked above");
    touch_consumer(group, &consumer, now_ms, false);
    let mut replies = Vec::new();
    let Some(from) = after.next() else { return Ok(Data::Array(replies)) };
    for (id, pending) in group.pending.range_mut(from..) {
        if replies.len() == take {
            break;
        }
        if pending.consumer != consumer {
            continue;
        }
        pending.delivered_ms = now_ms;
        pending.deliveries += 1;
        replies.push(match entries.get(id) {
            Some(fields) => entry_data(*id, fields),
            None => Data::Array(vec![id.data(), Data::NilArray]),
        });
    }
    Ok(Data::Array(replies))
}

fn xack(args: &Args, slot: &mut Slot) -> Reply {
    let ids = args.from(3).iter().map(|arg| parse_id(arg, 0)).collect::<Result<Vec<_>, _>>()?;
    let exists = slot.stream()?.is_some_and(|stream| stream.groups.contains_key(args.get(2)));
    if !exists {
        return Ok(Data::Integer(0));
    }
    let group = slot.stream_mut()?.groups.get_mut(args.get(2)).expect("checked above");
    Ok(Data::Integer(ids.iter().filter(|id| group.pending.remove(id).is_some()).count() as i64))
}

fn idle_ms(now_ms: u64, since_ms: u64) -> i64 {
    now_ms.saturating_sub(since_ms) as i64
}

fn xpending(args: &Args, slot: &Slot) -> Reply {
    let (key, name) = (args.get(1), args.get(2));
    let group =
        slot.stream()?.and_then(|stream| stream.groups.get(name)).ok_or_else(|| no_group(key, name))?;
    if args.len() == 3 {
        return Ok(pending_summary(group));
    }
    let mut at = 3;
    let mut min_idle_ms = None;
    if args.word(at) == "IDLE" && at + 1 < args.len() {
        min_idle_ms = Some(args.int(at + 1)?);
        at += 2;
    }
    if args.len() < at + 3 || args.len() > at + 4 {
        return Err(syntax_error());
    }
    let (low, high) = (parse_bound(args.get(at), true)?, parse_bound(args.get(at + 1), false)?);
    let count = args.int(at + 2)?.max(0) as usize;
    let consumer = (args.len() == at + 4).then(|| args.get(at + 3));
    let (Some(low), Some(high)) = (low, high) else { return Ok(Data::Array(Vec::new())) };
    if low > high {
        return Ok(Data::Array(Vec::new()));
    }
    let now_ms = slot.now_ms();
    let rows = group
        .pending
        .range(low..=high)
        .filter(|(_, pending)| consumer.is_none_or(|name| pending.consumer == name))
        .filter(|(_, pending)| min_idle_ms.is_none_or(|min| idle_ms(now_ms, pending.delivered_ms) >= min))
        .take(count)
        .map(|(id, pending)| {
            Data::Array(vec![
                id.data(),
                Data::Bulk(pending.consumer.clone()),
                Data::Integer(idle_ms(now_ms, pending.delivered_ms)),
                Data::Integer(pending.deliveries as i64),
            ])
        })
        .collect();
    Ok(Data::Array(rows))
}

/// XPENDING's summary: count, lowest and highest ID, and each consumer's count.
fn pending_summary(group: &Group) -> Data {
    let (Some((first, _)), Some((last, _))) =
        (group.pending.first_key_value(), group.pending.last_key_value())
    else {
        return Data::Array(vec![Data::Integer(0), Data::Nil, Data::Nil, Data::NilArray]);
    };
    let mut per_consumer: BTreeMap<&Bytes, u64> = BTreeMap::new();
    for pending in group.pending.values() {
        *per_consumer.entry(&pending.consumer).or_default() += 1;
    }
    let consumers = per_consumer
        .into_iter()
        .map(|(name, count)| Data::Array(vec![Data::Bulk(name.clone()), Data::bulk(count.to_string())]))
        .collect();
    Data::Array(vec![
        Data::Integer(group.pending.len() as i64),
        first.data(),
        last.data(),
        Data::Array(consumers),
    ])
}

/// Take over pending entry `id` for `consumer` (XCLAIM, XAUTOCLAIM). `None`: the entry was
/// deleted from the stream (it leaves the pending list).
fn claim(
    stream: &mut Stream,
    group_name: &Bytes,
    id: StreamId,
    consumer: &Bytes,
    delivered_ms: u64,
    count_delivery: bool,
) -> Option<Data> {
    let group = stream.groups.get_mut(group_name).expect("checked by the caller");
    let Some(fields) = stream.entries.get(&id) else {
        group.pending.remove(&id);
        return None;
    };
    let pending = group.pending.get_mut(&id).expect("checked by the caller");
    pending.consumer = consumer.clone();
    pending.delivered_ms = delivered_ms;
    if count_delivery {
        pending.deliveries += 1;
    }
    Some(entry_data(id, fields))
}

fn xclaim(args: &Args, slot: &mut Slot) -> Reply {
    let (key, group_name, consumer) = (args.get(1), args.get(2).clone(), args.get(3).clone());
    let min_idle_ms = args.int(4)?;
    let now_ms = slot.now_ms();
    let (mut ids, mut at) = (Vec::new(), 5);
    while at < args.len() {
        match parse_id(args.get(at), 0) {
            Ok(id) => ids.push(id),
            Err(_) => break,
        }
        at += 1;
    }
    let (mut delivered_ms, mut retry_count, mut force, mut just_id) = (now_ms, None, false, false);
    while at < args.len() {
        let value = || if at + 1 < args.len() { args.int(at + 1) } else { Err(syntax_error()) };
        match args.word(at).as_str() {
            "IDLE" => delivered_ms = now_ms.saturating_sub(value()?.max(0) as u64),
            "TIME" => delivered_ms = value()?.max(0) as u64,
            "RETRYCOUNT" => retry_count = Some(value()?.max(0) as u64),
            "LASTID" => {
                parse_id(args.get(at + 1), 0)?;
            }
            "FORCE" => force = true,
            "JUSTID" => just_id = true,
            _ => return Err(syntax_error()),
        }
        at += if matches!(args.word(at).as_str(), "FORCE" | "JUSTID") { 1 } else { 2 };
    }
    let missing = slot.stream()?.is_none_or(|stream| !stream.groups.contains_key(&group_name));
    if missing {
        return Err(no_group(key, &group_name));
    }
    let stream = slot.stream_mut()?;
    let mut replies = Vec::new();
    for id in ids {
        let group = stream.groups.get_mut(&group_name).expect("checked above");
        if !group.pending.contains_key(&id) {
            if !force || !stream.entries.contains_key(&id) {
                continue;
            }
            let pending = Pending { consumer: consumer.clone(), delivered_ms, deliveries: 0 };
            stream.groups.get_mut(&group_name).expect("checked above").pending.insert(id, pending);
        }
        let group = stream.groups.get_mut(&group_name).expect("checked above");
        if idle_ms(now_ms, group.pending[&id].delivered_ms) < min_idle_ms {
            continue;
        }
        if let Some(entry) = claim(stream, &group_name, id, &consumer, delivered_ms, !just_id) {
            if let Some(retries) = retry_count {
                let group = stream.groups.get_mut(&group_name).expect("checked above");
                group.pending.get_mut(&id).expect("claimed").deliveries = retries;
            }
            replies.push(if just_id { id.data() } else { entry });
        }
    }
    let group = stream.groups.get_mut(&group_name).expect("checked above");
    touch_consumer(group, &consumer, now_ms, !replies.is_empty());
    Ok(Data::Array(replies))
}

fn xautoclaim(args: &Args, slot: &mut Slot) -> Reply {
    let (key, group_name, consumer) = (args.get(1), args.get(2).clone(), args.get(3).clone());
    let min_idle_ms = args.int(4)?;
    let start = parse_bound(args.get(5), true)?.ok_or_else(invalid_id)?;
    let (mut count, mut just_id, mut at) = (100usize, false, 6);
    while at < args.len() {
        match args.word(at).as_str() {
            "COUNT" if at + 1 < args.len() => {
                let wanted = args.int(at + 1)?;
                if !(1..=i64::MAX / 10).contains(&wanted) {
                    return Err("ERR COUNT must be > 0".into());
                }
                count = wanted as usize;
                at += 2;
            }
            "JUSTID" => {
                just_id = true;
                at += 1;
            }
            _ => return Err(syntax_error()),
        }
    }
    let missing = slot.stream()?.is_none_or(|stream| !stream.groups.contains_key(&group_name));
    if missing {
        return Err(no_group(key, &group_name));
    }
    let now_ms = slot.now_ms();
    let stream = slot.stream_mut()?;
    let scanned: Vec<StreamId> =
        stream.groups[&group_name].pending.range(start..).map(|(id, _)| *id).take(count + 1).collect();
    let next = if scanned.len() > count { scanned[count] } else { StreamId::ZERO };
    let (mut claimed, mut deleted) = (Vec::new(), Vec::new());
    for id in scanned.into_iter().take(count) {
        let delivered_ms = stream.groups[&group_name].pending[&id].delivered_ms;
        if idle_ms(now_ms, delivered_ms) < min_idle_ms {
            continue;
        }
        match claim(stream, &group_name, id, &consumer, now_ms, !just_id) {
            Some(entry) => claimed.push(if just_id { id.data() } else { entry }),
            None => deleted.push(id.data()),
        }
    }
    let group = stream.groups.get_mut(&group_name).expect("checked above");
    touch_consumer(group, &consumer, now_ms, !claimed.is_empty());
    Ok(Data::Array(vec![next.data(), Data::Array(claimed), Data::Array(deleted)]))
}

fn map(pairs: Vec<(&str, Data)>) -> Data {
    Data::Map(pairs.into_iter().map(|(name, value)| (Data::bulk(name), value)).collect())
}

fn optional_count(value: Option<u64>) -> Data {
    value.map_or(Data::Nil, |value| Data::Integer(value as i64))
}

fn xinfo(args: &Args, slot: &Slot) -> Reply {
    let sub = args.word(1);
    if sub == "HELP" {
        return Ok(Data::bulks(
            ["XINFO CONSUMERS", "XINFO GROUPS", "XINFO STREAM"]
                .map(|line| Bytes::from_static(line.as_bytes())),
        ));
    }
    if args.len() < 3 {
        return Err(super::arity("xinfo"));
    }
    let Some(stream) = slot.stream()? else { return Err("ERR no such key".into()) };
    let now_ms = slot.now_ms();
    match sub.as_str() {
        "STREAM" => xinfo_stream(args, stream),
        "GROUPS" => Ok(Data::Array(
            stream
                .groups
                .iter()
                .map(|(name, group)| {
                    map(vec![
                        ("name", Data::Bulk(name.clone())),
                        ("consumers", Data::Integer(group.consumers.len() as i64)),
                        ("pending", Data::Integer(group.pending.len() as i64)),
                        ("last-delivered-id", group.last_id.data()),
                        ("entries-read", optional_count(group.entries_read)),
                        ("lag", optional_count(lag(stream, group))),
                    ])
                })
                .collect(),
        )),
        "CONSUMERS" if args.len() == 4 => {
            let group = stream.groups.get(args.get(3)).ok_or_else(|| no_group(args.get(2), args.get(3)))?;
            Ok(Data::Array(
                group
                    .consumers
                    .iter()
                    .map(|(name, consumer)| {
                        let pending = group.pending.values().filter(|p| p.consumer == name).count();
                        let inactive = consumer.active_ms.map_or(-1, |at| idle_ms(now_ms, at));
                        map(vec![
                            ("name", Data::Bulk(name.clone())),
                            ("pending", Data::Integer(pending as i64)),
                            ("idle", Data::Integer(idle_ms(now_ms, consumer.seen_ms))),
                            ("inactive", Data::Integer(inactive)),
                        ])
                    })
                    .collect(),
            ))
        }
        _ => Err(format!("ERR unknown subcommand or wrong number of arguments for '{sub}'. Try XINFO HELP.")),
    }
}

fn xinfo_stream(args: &Args, stream: &Stream) -> Reply {
    let full = match args.len() {
        3 => None,
        4 if args.word(3) == "FULL" => Some(10),
        6 if args.word(3) == "FULL" && args.word(4) == "COUNT" => Some(args.int(5)?.max(0) as usize),
        _ => return Err(syntax_error()),
    };
    let first_id = stream.entries.first_key_value().map_or(StreamId::ZERO, |(id, _)| *id);
    let mut pairs = vec![
        ("length", Data::Integer(stream.entries.len() as i64)),
        ("radix-tree-keys", Data::Integer(stream.entries.len().div_ceil(NODE_ENTRIES as usize) as i64)),
        ("radix-tree-nodes", Data::Integer(1 + stream.entries.len().div_ceil(NODE_ENTRIES as usize) as i64)),
        ("last-generated-id", stream.last_id.data()),
        ("max-deleted-entry-id", stream.max_deleted.data()),
        ("entries-added", Data::Integer(stream.entries_added as i64)),
        ("recorded-first-entry-id", first_id.data()),
    ];
    let entry = |item: Option<(&StreamId, &Vec<(Bytes, Bytes)>)>| {
        item.map_or(Data::Nil, |(id, f)| entry_data(*id, f))
    };
    let Some(count) = full else {
        pairs.push(("groups", Data::Integer(stream.groups.len() as i64)));
        pairs.push(("first-entry", entry(stream.entries.first_key_value())));
        pairs.push(("last-entry", entry(stream.entries.last_key_value())));
        return Ok(map(pairs));
    };
    let take = if count == 0 { usize::MAX } else { count };
    pairs.push((
        "entries",
        Data::Array(stream.entries.iter().take(take).map(|(id, f)| entry_data(*id, f)).collect()),
    ));
    let groups = stream
        .groups
        .iter()
        .map(|(name, group)| {
            let pending = group
                .pending
                .iter()
                .take(take)
                .map(|(id, p)| {
                    Data::Array(vec![
                        id.data(),
                        Data::Bulk(p.consumer.clone()),
                        Data::Integer(p.delivered_ms as i64),
                        Data::Integer(p.deliveries as i64),
                    ])
                })
                .collect();
            let consumers = group
                .consumers
                .iter()
                .map(|(consumer_name, consumer)| {
                    let own: Vec<Data> = group
                        .pending
                        .iter()
                        .filter(|(_, p)| p.consumer == consumer_name)
                        .take(take)
                        .map(|(id, p)| {
                            Data::Array(vec![
                                id.data(),
                                Data::Integer(p.delivered_ms as i64),
                                Data::Integer(p.deliveries as i64),
                            ])
                        })
                        .collect();
                    let pel_count = group.pending.values().filter(|p| p.consumer == consumer_name).count();
                    map(vec![
                        ("name", Data::Bulk(consumer_name.clone())),
                        ("seen-time", Data::Integer(consumer.seen_ms as i64)),
                        (
                            "active-time",
                            consumer.active_ms.map_or(Data::Integer(-1), |at| Data::Integer(at as i64)),
                        ),
                        ("pel-count", Data::Integer(pel_count as i64)),
                        ("pending", Data::Array(own)),
                    ])
                })
                .collect();
            map(vec![
                ("name", Data::Bulk(name.clone())),
                ("last-delivered-id", group.last_id.data()),
                ("entries-read", optional_count(group.entries_read)),
                ("lag", optional_count(lag(stream, group))),
                ("pel-count", Data::Integer(group.pending.len() as i64)),
                ("pending", Data::Array(pending)),
                ("consumers", Data::Array(consumers)),
            ])
        })
        .collect();
    pairs.push(("groups", Data::Array(groups)));
    Ok(map(pairs))
}
