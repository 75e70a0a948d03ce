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
        "bitfield" => bitfield(args, slot, false),
        "bitfield_ro" => bitfield(args, slot, true),
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

// ------------------------------------------------------------------------------ BITFIELD

/// What BITFIELD does with a value that does not fit its type (Redis' OVERFLOW).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Overflow {
    Wrap,
    Sat,
    Fail,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum FieldOp {
    Get,
    Set(i64),
    IncrBy(i64),
}

/// One `GET|SET|INCRBY type offset [value]` of a BITFIELD, with the OVERFLOW before it.
#[derive(Clone, Copy)]
struct Field {
    op: FieldOp,
    signed: bool,
    bits: u32,
    offset: u64,
    overflow: Overflow,
}

/// `i1`..`i64` or `u1`..`u63`: (signed, bits).
fn field_type(arg: &[u8]) -> Result<(bool, u32), Fail> {
    let invalid = || {
        "ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is."
            .to_string()
    };
    let (signed, digits) = match arg.split_first() {
        Some((b'i' | b'I', digits)) => (true, digits),
        Some((b'u' | b'U', digits)) => (false, digits),
        _ => return Err(invalid()),
    };
    let bits: u32 = std::str::from_utf8(digits).ok().and_then(|d| d.parse().ok()).ok_or_else(invalid)?;
    let max = if signed { 64 } else { 63 };
    if bits < 1 || bits > max {
        return Err(invalid());
    }
    Ok((signed, bits))
}

/// A bit offset, or `#n` for the n-th field of this width; the field must end within 512 MB.
fn field_offset(arg: &[u8], bits: u32) -> Result<u64, Fail> {
    let invalid = || "ERR bit offset is not an integer or out of range".to_string();
    let (hash, digits) = match arg.strip_prefix(b"#") {
        Some(digits) => (true, digits),
        None => (false, arg),
    };
    let offset = parse_int(digits).map_err(|_| invalid())?;
    let offset = if hash { offset.checked_mul(bits as i64).ok_or_else(invalid)? } else { offset };
    if offset < 0 || (offset >> 3) >= STRING_BYTES_MAX {
        return Err(invalid());
    }
    Ok(offset as u64)
}

/// Parse every subcommand first, as Redis does: a bad one changes nothing.
fn parse_fields(args: &Args, readonly: bool) -> Result<Vec<Field>, Fail> {
    let mut fields = Vec::new();
    let mut overflow = Overflow::Wrap;
    let mut at = 2;
    while at < args.len() {
        let word = args.word(at);
        let left = args.len() - at - 1;
        let op = match word.as_str() {
            "OVERFLOW" if left >= 1 => {
                overflow = match args.word(at + 1).as_str() {
                    "WRAP" => Overflow::Wrap,
                    "SAT" => Overflow::Sat,
                    "FAIL" => Overflow::Fail,
                    _ => return Err("ERR Invalid OVERFLOW type specified".into()),
                };
                at += 2;
                continue;
            }
            "GET" if left >= 2 => None,
            "SET" | "INCRBY" if left >= 3 => Some(word == "SET"),
            _ => return Err(syntax_error()),
        };
        // Redis' order: the type, the offset, then the value.
        let (signed, bits) = field_type(args.get(at + 1))?;
        let offset = field_offset(args.get(at + 2), bits)?;
        let op = match op {
            None => FieldOp::Get,
            Some(true) => FieldOp::Set(args.int(at + 3)?),
            Some(false) => FieldOp::IncrBy(args.int(at + 3)?),
        };
        fields.push(Field { op, signed, bits, offset, overflow });
        at += if op == FieldOp::Get { 3 } else { 4 };
    }
    if readonly && fields.iter().any(|field| field.op != FieldOp::Get) {
        return Err("ERR BITFIELD_RO only supports the GET subcommand".into());
    }
    Ok(fields)
}

/// How long the string must be for BITFIELD's writes (0: it only reads); what the bytes
/// bound of a BITFIELD op grows the value to.
pub(super) fn bitfield_bytes(args: &Args) -> usize {
    parse_fields(args, false)
        .unwrap_or_default()
        .iter()
        .filter(|field| field.op != FieldOp::Get)
        .map(|field| ((field.offset + field.bits as u64 - 1) / 8 + 1) as usize)
        .max()
        .unwrap_or(0)
}

fn read_bits(bytes: &[u8], offset: u64, bits: u32) -> u64 {
    (0..bits as u64).fold(0, |value, i| {
        let at = offset + i;
        let bit = bytes.get((at / 8) as usize).is_some_and(|byte| byte & (0x80 >> (at % 8)) != 0);
        (value << 1) | bit as u64
    })
}

fn write_bits(bytes: &mut [u8], offset: u64, bits: u32, value: u64) {
    for i in 0..bits as u64 {
        let at = offset + i;
        let mask = 0x80u8 >> (at % 8);
        let byte = &mut bytes[(at / 8) as usize];
        if value >> (bits as u64 - 1 - i) & 1 == 1 {
            *byte |= mask;
        } else {
            *byte &= !mask;
        }
    }
}

/// The field's value read as its type.
fn field_value(bytes: &[u8], field: &Field) -> i64 {
    let raw = read_bits(bytes, field.offset, field.bits);
    if field.signed && field.bits < 64 && raw >> (field.bits - 1) & 1 == 1 {
        (raw | (u64::MAX << field.bits)) as i64
    } else {
        raw as i64
    }
}

/// `value + incr` in the field's type: the result, or `None` if it overflows with FAIL
/// (Redis' checkSignedBitfieldOverflow / checkUnsignedBitfieldOverflow).
fn add_in_type(value: i64, incr: i64, field: &Field) -> Option<i64> {
    let bits = field.bits;
    let (min, max): (i128, i128) = if field.signed {
        (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
    } else {
        (0, (1i128 << bits) - 1)
    };
    // An unsigned field's value, and SET's value for it, are read as unsigned (as Redis casts).
    let value = if field.signed { value as i128 } else { value as u64 as i128 };
    let sum = value + incr as i128;
    if (min..=max).contains(&sum) {
        return Some(sum as i64);
    }
    match field.overflow {
        Overflow::Fail => None,
        Overflow::Sat => Some(if sum > max { max } else { min } as i64),
        Overflow::Wrap => {
            let wrapped = (sum as u128 as u64) & if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
            let sign_extended = if field.signed && bits < 64 && wrapped >> (bits - 1) & 1 == 1 {
                wrapped | (u64::MAX << bits)
            } else {
                wrapped
            };
            Some(sign_extended as i64)
        }
    }
}

/// BITFIELD / BITFIELD_RO: every field read or written in order, as Redis 7 answers.
pub(super) fn bitfield(args: &Args, slot: &mut Slot, readonly: bool) -> Reply {
    let fields = parse_fields(args, readonly)?;
    let needed = bitfield_bytes(args);
    if needed == 0 {
        let value = slot.string()?.cloned().unwrap_or_default();
        return Ok(Data::Array(
            fields.iter().map(|field| Data::Integer(field_value(&value, field))).collect(),
        ));
    }
    // As in Redis, the string grows to hold every written field before any runs, even if
    // an OVERFLOW FAIL then writes nothing.
    let value = slot.string_mut()?;
    let mut bytes = value.to_vec();
    if bytes.len() < needed {
        bytes.resize(needed, 0);
    }
    let mut replies = Vec::with_capacity(fields.len());
    for field in &fields {
        let old = field_value(&bytes, field);
        let (new, reply) = match field.op {
            FieldOp::Get => {
                replies.push(Data::Integer(old));
                continue;
            }
            FieldOp::Set(value) => (add_in_type(value, 0, field), old),
            FieldOp::IncrBy(incr) => match add_in_type(old, incr, field) {
                Some(new) => (Some(new), new),
                None => (None, 0),
            },
        };
        match new {
            Some(new) => {
                write_bits(&mut bytes, field.offset, field.bits, new as u64);
                replies.push(Data::Integer(reply));
            }
            None => replies.push(Data::Nil),
        }
    }
    *value = Bytes::from(bytes);
    Ok(Data::Array(replies))
}
