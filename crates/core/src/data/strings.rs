//! Strings: SET with every option, expiry on write, ranges, floats and bits.

use bytes::{Bytes, BytesMut};

use super::{
    format_double, not_integer, parse_int, syntax_error, Args, Data, Entry, Fail, Reply, Slot, Typed,
};

pub(super) fn run(name: &str, args: &Args, slot: &mut Slot) -> Option<Reply> {
    Some(match name {
        "set" => set(args, slot),
        "setnx" => set_with(slot, args.get(2), Condition::IfAbsent, false, Expiry::Clear)
            .map(|done| Data::Integer(matches!(done, Data::Status(_)) as i64)),
        "getset" => set_with(slot, args.get(2), Condition::Always, true, Expiry::Clear),
        "setex" | "psetex" => {
            let unit_ms = if name == "setex" { 1000 } else { 1 };
            match relative_deadline(slot, args.int(2), unit_ms, name) {
                Ok(deadline) => set_with(slot, args.get(3), Condition::Always, false, Expiry::At(deadline)),
                Err(fail) => Err(fail),
            }
        }
        "get" => slot.string().map(|value| Data::optional(value.cloned())),
        "getex" => getex(args, slot),
        "getdel" => getdel(slot),
        "append" => append(args, slot),
        "strlen" => slot.string().map(|value| Data::Integer(value.map_or(0, |v| v.len() as i64))),
        "getrange" | "substr" => getrange(args, slot),
        "setrange" => setrange(args, slot),
        "incr" => increment(slot, Ok(1)),
        "decr" => increment(slot, Ok(-1)),
        "incrby" => increment(slot, args.int(2)),
        "decrby" => increment(slot, args.int(2).and_then(|d| d.checked_neg().ok_or_else(not_integer))),
        "incrbyfloat" => increment_float(args, slot),
        "setbit" => setbit(args, slot),
        "getbit" => getbit(args, slot),
        "bitcount" => bitcount(args, slot),
        "bitpos" => bitpos(args, slot),
        _ => return None,
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Condition {
    Always,
    IfAbsent,
    IfPresent,
}

/// What a write does to the key's deadline.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Expiry {
    /// A plain SET forgets the deadline (as in Redis).
    Clear,
    Keep,
    At(u64),
}

/// `now + amount * unit_ms`, refusing non-positive and overflowing times as Redis does.
pub(super) fn relative_deadline(
    slot: &Slot,
    amount: Result<i64, Fail>,
    unit_ms: i64,
    name: &str,
) -> Result<u64, Fail> {
    let invalid = || format!("ERR invalid expire time in '{name}' command");
    let amount = amount?;
    if amount <= 0 {
        return Err(invalid());
    }
    let ms = amount.checked_mul(unit_ms).ok_or_else(invalid)?;
    (slot.now_ms() as i64).checked_add(ms).map(|at| at as u64).ok_or_else(invalid)
}

fn absolute_deadline(amount: Result<i64, Fail>, unit_ms: i64, name: &str) -> Result<u64, Fail> {
    let invalid = || format!("ERR invalid expire time in '{name}' command");
    let amount = amount?;
    if amount <= 0 {
        return Err(invalid());
    }
    amount.checked_mul(unit_ms).map(|at| at as u64).ok_or_else(invalid)
}

fn set(args: &Args, slot: &mut Slot) -> Reply {
    let (mut condition, mut get, mut expiry) = (Condition::Always, false, Expiry::Clear);
    let mut expiry_given = false;
    let mut i = 3;
    while i < args.len() {
        let word = args.word(i);
        match word.as_str() {
            "NX" if condition == Condition::Always => condition = Condition::IfAbsent,
            "XX" if condition == Condition::Always => condition = Condition::IfPresent,
            "GET" => get = true,
            "KEEPTTL" if !expiry_given => {
                expiry = Expiry::Keep;
                expiry_given = true;
            }
            "EX" | "PX" | "EXAT" | "PXAT" if !expiry_given && i + 1 < args.len() => {
                let amount = args.int(i + 1);
                let deadline = match word.as_str() {
                    "EX" => relative_deadline(slot, amount, 1000, "set")?,
                    "PX" => relative_deadline(slot, amount, 1, "set")?,
                    "EXAT" => absolute_deadline(amount, 1000, "set")?,
                    _ => absolute_deadline(amount, 1, "set")?,
                };
                expiry = Expiry::At(deadline);
                expiry_given = true;
                i += 1;
            }
            _ => return Err(syntax_error()),
        }
        i += 1;
    }
    let done = set_with(slot, args.get(2), condition, get, expiry)?;
    Ok(done)
}

/// SET's core: the reply is OK/nil, or the old value with `get`.
fn set_with(slot: &mut Slot, value: &Bytes, condition: Condition, get: bool, expiry: Expiry) -> Reply {
    let old = if get { slot.string()?.cloned() } else { None };
    let proceed = match condition {
        Condition::Always => true,
        Condition::IfAbsent => !slot.exists(),
        Condition::IfPresent => slot.exists(),
    };
    if proceed {
        let deadline_ms = match expiry {
            Expiry::Clear => None,
            Expiry::Keep => slot.entry().and_then(|entry| entry.deadline_ms),
            Expiry::At(at) => Some(at),
        };
        // A deadline already past deletes the key, as Redis does for SET .. PXAT <past>.
        let entry = Entry { value: Typed::String(value.clone()), deadline_ms };
        let live = deadline_ms.is_none_or(|at| at > slot.now_ms());
        slot.put(live.then_some(entry));
    }
    Ok(match (get, proceed) {
        (true, _) => Data::optional(old),
        (false, true) => Data::ok(),
        (false, false) => Data::Nil,
    })
}

fn getex(args: &Args, slot: &mut Slot) -> Reply {
    let value = slot.string()?.cloned();
    let mut deadline = None;
    let mut persist = false;
    let mut i = 2;
    while i < args.len() {
        let word = args.word(i);
        match word.as_str() {
            "PERSIST" if deadline.is_none() && !persist => persist = true,
            "EX" | "PX" | "EXAT" | "PXAT" if deadline.is_none() && !persist && i + 1 < args.len() => {
                let amount = args.int(i + 1);
                deadline = Some(match word.as_str() {
                    "EX" => relative_deadline(slot, amount, 1000, "getex")?,
                    "PX" => relative_deadline(slot, amount, 1, "getex")?,
                    "EXAT" => absolute_deadline(amount, 1000, "getex")?,
                    _ => absolute_deadline(amount, 1, "getex")?,
                });
                i += 1;
            }
            _ => return Err(syntax_error()),
        }
        i += 1;
    }
    if value.is_some() {
        if persist {
            slot.set_deadline(None);
        } else if let Some(at) = deadline {
            if at <= slot.now_ms() {
                slot.put(None);
            } else {
                slot.set_deadline(Some(at));
            }
        }
    }
    Ok(Data::optional(value))
}

fn getdel(slot: &mut Slot) -> Reply {
    let value = slot.string()?.cloned();
    if value.is_some() {
        slot.put(None);
    }
    Ok(Data::optional(value))
}

fn append(args: &Args, slot: &mut Slot) -> Reply {
    let value = slot.string_mut()?;
    let mut joined = BytesMut::from(&value[..]);
    joined.extend_from_slice(args.get(2));
    *value = joined.freeze();
    Ok(Data::Integer(value.len() as i64))
}

fn getrange(args: &Args, slot: &mut Slot) -> Reply {
    let (start, stop) = (args.int(2)?, args.int(3)?);
    let value = slot.string()?.cloned().unwrap_or_default();
    if start < 0 && stop < 0 && start > stop {
        return Ok(Data::bulk(""));
    }
    Ok(match super::clamp_range(start, stop, value.len()) {
        Some((from, to)) => Data::Bulk(value.slice(from..=to)),
        None => Data::bulk(""),
    })
}

/// The most bytes SETRANGE and SETBIT may grow a string to (Redis' proto-max-bulk-len).
const STRING_BYTES_MAX: i64 = 512 * 1024 * 1024;

fn setrange(args: &Args, slot: &mut Slot) -> Reply {
    let offset = args.int(2)?;
    if offset < 0 {
        return Err("ERR offset is out of range".into());
    }
    let patch = args.get(3);
    if offset + patch.len() as i64 > STRING_BYTES_MAX {
        return Err("ERR string exceeds maximum allowed size (proto-max-bulk-len)".into());
    }
    if patch.is_empty() {
        return slot.string().map(|value| Data::Integer(value.map_or(0, |v| v.len() as i64)));
    }
    let value = slot.string_mut()?;
    let mut bytes = value.to_vec();
    let end = offset as usize + patch.len();
    if bytes.len() < end {
        bytes.resize(end, 0);
    }
    bytes[offset as usize..end].copy_from_slice(patch);
    *value = Bytes::from(bytes);
    Ok(Data::Integer(value.len() as i64))
}

fn increment(slot: &mut Slot, delta: Result<i64, Fail>) -> Reply {
    let delta = delta?;
    let current = match slot.string()? {
        None => 0,
        Some(value) => parse_int(value)?,
    };
    let new = current.checked_add(delta).ok_or("ERR increment or decrement would overflow")?;
    *slot.string_mut()? = Bytes::from(new.to_string());
    Ok(Data::Integer(new))
}

fn increment_float(args: &Args, slot: &mut Slot) -> Reply {
    let delta = args.float(2)?;
    let current = match slot.string()? {
        None => 0.0,
        Some(value) => super::parse_float(value).map_err(|_| "ERR value is not a valid float".to_string())?,
    };
    let new = current + delta;
    if !new.is_finite() {
        return Err("ERR increment would produce NaN or Infinity".into());
    }
    let text = format_double(new);
    *slot.string_mut()? = Bytes::from(text.clone());
    Ok(Data::bulk(text))
}

fn bit_offset(args: &Args, at: usize) -> Result<usize, Fail> {
    let offset = args.int(at).map_err(|_| "ERR bit offset is not an integer or out of range".to_string())?;
    if !(0..STRING_BYTES_MAX * 8).contains(&offset) {
        return Err("ERR bit offset is not an integer or out of range".into());
    }
    Ok(offset as usize)
}

fn setbit(args: &Args, slot: &mut Slot) -> Reply {
    let offset = bit_offset(args, 2)?;
    let bit = match args.get(3).as_ref() {
        b"0" => 0u8,
        b"1" => 1u8,
        _ => return Err("ERR bit is not an integer or out of range".into()),
    };
    let value = slot.string_mut()?;
    let mut bytes = value.to_vec();
    let byte = offset / 8;
    if bytes.len() <= byte {
        bytes.resize(byte + 1, 0);
    }
    let mask = 0x80u8 >> (offset % 8);
    let old = (bytes[byte] & mask != 0) as i64;
    if bit == 1 {
        bytes[byte] |= mask;
    } else {
        bytes[byte] &= !mask;
    }
    *value = Bytes::from(bytes);
    Ok(Data::Integer(old))
}

fn getbit(args: &Args, slot: &mut Slot) -> Reply {
    let offset = bit_offset(args, 2)?;
    let value = slot.string()?.cloned().unwrap_or_default();
    let bit = value.get(offset / 8).is_some_and(|byte| byte & (0x80 >> (offset % 8)) != 0);
    Ok(Data::Integer(bit as i64))
}

/// BITCOUNT/BITPOS's optional `start end [BYTE|BIT]`: the bit range to look at.
fn bit_range(args: &Args, from: usize, len_bytes: usize) -> Result<Option<(usize, usize)>, Fail> {
    if args.len() <= from {
        return Ok((len_bytes > 0).then(|| (0, len_bytes * 8 - 1)));
    }
    let start = args.int(from)?;
    let end = if args.len() > from + 1 { args.int(from + 1)? } else { -1 };
    let bits = match args.len() {
        n if n > from + 3 => return Err(syntax_error()),
        n if n == from + 3 => match args.word(from + 2).as_str() {
            "BIT" => true,
            "BYTE" => false,
            _ => return Err(syntax_error()),
        },
        _ => false,
    };
    let unit_len = if bits { len_bytes * 8 } else { len_bytes };
    Ok(super::clamp_range(start, end, unit_len).map(|(a, b)| if bits { (a, b) } else { (a * 8, b * 8 + 7) }))
}

fn bit_at(bytes: &[u8], bit: usize) -> bool {
    bytes[bit / 8] & (0x80 >> (bit % 8)) != 0
}

fn bitcount(args: &Args, slot: &mut Slot) -> Reply {
    if args.len() == 3 {
        return Err(syntax_error());
    }
    let value = slot.string()?.cloned().unwrap_or_default();
    let count = bit_range(args, 2, value.len())?
        .map_or(0, |(from, to)| (from..=to).filter(|bit| bit_at(&value, *bit)).count());
    Ok(Data::Integer(count as i64))
}

fn bitpos(args: &Args, slot: &mut Slot) -> Reply {
    let wanted = match args.get(2).as_ref() {
        b"0" => false,
        b"1" => true,
        _ => return Err("ERR The bit argument must be 1 or 0.".into()),
    };
    let value = slot.string()?.cloned().unwrap_or_default();
    if value.is_empty() {
        return Ok(Data::Integer(if wanted { -1 } else { 0 }));
    }
    let explicit_end = args.len() > 4;
    let Some((from, to)) = bit_range(args, 3, value.len())? else { return Ok(Data::Integer(-1)) };
    match (from..=to).find(|bit| bit_at(&value, *bit) == wanted) {
        Some(bit) => Ok(Data::Integer(bit as i64)),
        // Looking for a clear bit past the end of the string finds one, unless an end was given.
        None if !wanted && !explicit_end => Ok(Data::Integer((to + 1) as i64)),
        None => Ok(Data::Integer(-1)),
    }
}
