//! Per-key commands that work on any type: expiry, TYPE, EXISTS, DEL, OBJECT, MEMORY.

use super::{Args, Data, Reply, Slot, Typed};

pub(super) fn run(name: &str, args: &Args, slot: &mut Slot) -> Option<Reply> {
    Some(match name {
        "expire" => expire(args, slot, 1000, false, name),
        "pexpire" => expire(args, slot, 1, false, name),
        "expireat" => expire(args, slot, 1000, true, name),
        "pexpireat" => expire(args, slot, 1, true, name),
        "persist" => Ok(Data::Integer(match slot.entry().and_then(|entry| entry.deadline_ms) {
            Some(_) => {
                slot.set_deadline(None);
                1
            }
            None => 0,
        })),
        "ttl" | "pttl" | "expiretime" | "pexpiretime" => Ok(ttl(name, slot)),
        "type" => Ok(Data::Status(slot.value().map_or("none", Typed::type_name).into())),
        "exists" | "touch" => Ok(Data::Integer(slot.exists() as i64)),
        "del" => Ok(Data::Integer(slot.take().is_some() as i64)),
        "object" => object(args, slot),
        "memory" => memory(args, slot),
        _ => return None,
    })
}

/// EXPIRE and friends, with NX / XX / GT / LT.
fn expire(args: &Args, slot: &mut Slot, unit_ms: i64, absolute: bool, name: &str) -> Reply {
    let invalid = || format!("ERR invalid expire time in '{name}' command");
    let amount = args.int(2)?;
    let ms = amount.checked_mul(unit_ms).ok_or_else(invalid)?;
    let deadline = if absolute { ms } else { (slot.now_ms() as i64).checked_add(ms).ok_or_else(invalid)? };
    let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
    for at in 3..args.len() {
        match args.word(at).as_str() {
            "NX" => nx = true,
            "XX" => xx = true,
            "GT" => gt = true,
            "LT" => lt = true,
            other => return Err(format!("ERR Unsupported option {other}")),
        }
    }
    if nx && (xx || gt || lt) {
        return Err("ERR NX and XX, GT or LT options at the same time are not compatible".into());
    }
    if gt && lt {
        return Err("ERR GT and LT options at the same time are not compatible".into());
    }
    let Some(entry) = slot.entry() else { return Ok(Data::Integer(0)) };
    let current = entry.deadline_ms;
    let allowed = match current {
        None => !xx && !gt,
        Some(at) => !nx && (!gt || deadline > at as i64) && (!lt || deadline < at as i64),
    };
    if !allowed {
        return Ok(Data::Integer(0));
    }
    if deadline <= slot.now_ms() as i64 {
        slot.put(None);
    } else {
        slot.set_deadline(Some(deadline as u64));
    }
    Ok(Data::Integer(1))
}

fn ttl(name: &str, slot: &Slot) -> Data {
    let Some(entry) = slot.entry() else { return Data::Integer(-2) };
    let Some(deadline) = entry.deadline_ms else { return Data::Integer(-1) };
    let remaining = deadline.saturating_sub(slot.now_ms());
    Data::Integer(match name {
        "ttl" => (remaining as i64 + 500) / 1000,
        "pttl" => remaining as i64,
        "expiretime" => (deadline as i64 + 500) / 1000,
        _ => deadline as i64,
    })
}

fn object(args: &Args, slot: &Slot) -> Reply {
    let Some(value) = slot.value() else { return Ok(Data::Nil) };
    Ok(match args.word(1).as_str() {
        "ENCODING" => Data::bulk(encoding(value)),
        "REFCOUNT" => Data::Integer(1),
        "IDLETIME" => Data::Integer(0),
        "FREQ" => Err("ERR An LFU maxmemory policy is not selected, access frequency not tracked. Please note that when switching between policies at runtime LRU and LFU data will take some time to adjust.".to_string())?,
        other => Err(format!("ERR unknown subcommand '{other}'. Try OBJECT HELP."))?,
    })
}

/// The encoding Redis 7 would report for a value of this shape.
fn encoding(value: &Typed) -> &'static str {
    let small = |count: usize, max: usize| count <= max;
    match value {
        Typed::String(bytes) if super::parse_int(bytes).is_ok() => "int",
        Typed::String(bytes) if bytes.len() <= 44 => "embstr",
        Typed::String(_) => "raw",
        Typed::List(items) if small(items.len(), 128) && items.iter().all(|item| item.len() <= 64) => {
            "listpack"
        }
        Typed::List(_) => "quicklist",
        Typed::Set(members)
            if members.iter().all(|m| super::parse_int(m).is_ok()) && members.len() <= 512 =>
        {
            "intset"
        }
        Typed::Set(members) if small(members.len(), 128) && members.iter().all(|m| m.len() <= 64) => {
            "listpack"
        }
        Typed::Set(_) => "hashtable",
        Typed::Hash(fields)
            if small(fields.len(), 128) && fields.iter().all(|(f, v)| f.len() <= 64 && v.len() <= 64) =>
        {
            "listpack"
        }
        Typed::Hash(_) => "hashtable",
        Typed::ZSet(members) if small(members.len(), 128) && members.keys().all(|m| m.len() <= 64) => {
            "listpack"
        }
        Typed::ZSet(_) => "skiplist",
        Typed::Stream(_) => "stream",
    }
}

fn memory(args: &Args, slot: &Slot) -> Reply {
    if args.word(1) != "USAGE" {
        return Err(format!("ERR unknown subcommand '{}'. Try MEMORY HELP.", args.word(1)));
    }
    let mut at = 3;
    while at < args.len() {
        match args.word(at).as_str() {
            "SAMPLES" if at + 1 < args.len() => {
                args.int(at + 1)?;
                at += 2;
            }
            _ => return Err(super::syntax_error()),
        }
    }
    let Some(entry) = slot.entry() else { return Ok(Data::Nil) };
    // The encoded value plus Redis' per-key overhead: what this key costs, roughly.
    let encoded = super::value::encode(entry).map_or(0, |bytes| bytes.len());
    Ok(Data::Integer((encoded + args.get(2).len() + 56) as i64))
}
