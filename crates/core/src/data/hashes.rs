//! The hash family (fields sorted, [`crate::hash`]'s encoding).

use bytes::Bytes;

use super::{format_double, parse_float, parse_int, Args, Data, Pick, Reply, Slot};
use crate::hash;

pub(super) fn run(name: &str, args: &Args, slot: &mut Slot) -> Option<Reply> {
    Some(match name {
        "hset" | "hmset" => hset(name, args, slot),
        "hsetnx" => hsetnx(args, slot),
        "hdel" => {
            let names: Vec<Bytes> = args.from(2).to_vec();
            slot.hash()
                .map(|fields| fields.is_some())
                .and_then(|present| if present { Ok(hash::remove(slot.hash_mut()?, &names)) } else { Ok(0) })
                .map(|removed| Data::Integer(removed as i64))
        }
        "hget" => read(slot, |fields| Data::optional(hash::get(fields, args.get(2)).cloned())),
        "hmget" => read(slot, |fields| {
            Data::Array(
                args.from(2).iter().map(|name| Data::optional(hash::get(fields, name).cloned())).collect(),
            )
        }),
        "hgetall" => read(slot, |fields| {
            Data::Map(fields.iter().map(|(f, v)| (Data::Bulk(f.clone()), Data::Bulk(v.clone()))).collect())
        }),
        "hexists" => read(slot, |fields| Data::Integer(hash::get(fields, args.get(2)).is_some() as i64)),
        "hlen" => read(slot, |fields| Data::Integer(fields.len() as i64)),
        "hkeys" => read(slot, |fields| Data::bulks(fields.iter().map(|(f, _)| f.clone()))),
        "hvals" => read(slot, |fields| Data::bulks(fields.iter().map(|(_, v)| v.clone()))),
        "hstrlen" => {
            read(slot, |fields| Data::Integer(hash::get(fields, args.get(2)).map_or(0, |v| v.len() as i64)))
        }
        "hincrby" => hincrby(args, slot),
        "hincrbyfloat" => hincrbyfloat(args, slot),
        "hrandfield" => hrandfield(args, slot),
        "hscan" => hscan(args, slot),
        _ => return None,
    })
}

/// Run `reply` on the hash (empty when the key is absent).
fn read(slot: &Slot, reply: impl FnOnce(&hash::Fields) -> Data) -> Reply {
    let empty = Vec::new();
    Ok(reply(slot.hash()?.unwrap_or(&empty)))
}

fn hset(name: &str, args: &Args, slot: &mut Slot) -> Reply {
    if !args.len().is_multiple_of(2) {
        return Err(format!("ERR wrong number of arguments for '{name}' command"));
    }
    let pairs: Vec<(Bytes, Bytes)> =
        args.from(2).chunks(2).map(|pair| (pair[0].clone(), pair[1].clone())).collect();
    let added = hash::set(slot.hash_mut()?, &pairs);
    Ok(if name == "hmset" { Data::ok() } else { Data::Integer(added as i64) })
}

fn hsetnx(args: &Args, slot: &mut Slot) -> Reply {
    if slot.hash()?.is_some_and(|fields| hash::get(fields, args.get(2)).is_some()) {
        return Ok(Data::Integer(0));
    }
    hash::set(slot.hash_mut()?, &[(args.get(2).clone(), args.get(3).clone())]);
    Ok(Data::Integer(1))
}

fn hincrby(args: &Args, slot: &mut Slot) -> Reply {
    let delta = args.int(3)?;
    let current = match slot.hash()?.and_then(|fields| hash::get(fields, args.get(2))) {
        None => 0,
        Some(value) => parse_int(value).map_err(|_| "ERR hash value is not an integer".to_string())?,
    };
    let new = current.checked_add(delta).ok_or("ERR increment or decrement would overflow")?;
    hash::set(slot.hash_mut()?, &[(args.get(2).clone(), Bytes::from(new.to_string()))]);
    Ok(Data::Integer(new))
}

fn hincrbyfloat(args: &Args, slot: &mut Slot) -> Reply {
    let delta = args.float(3)?;
    let current = match slot.hash()?.and_then(|fields| hash::get(fields, args.get(2))) {
        None => 0.0,
        Some(value) => parse_float(value).map_err(|_| "ERR hash value is not a float".to_string())?,
    };
    let new = current + delta;
    if !new.is_finite() {
        return Err("ERR increment would produce NaN or Infinity".into());
    }
    let text = format_double(new);
    hash::set(slot.hash_mut()?, &[(args.get(2).clone(), Bytes::from(text.clone()))]);
    Ok(Data::bulk(text))
}

fn hrandfield(args: &Args, slot: &Slot) -> Reply {
    let empty = Vec::new();
    let fields = slot.hash()?.unwrap_or(&empty);
    let with_values = match args.len() {
        2 | 3 => false,
        4 if args.word(3) == "WITHVALUES" => true,
        _ => return Err(super::syntax_error()),
    };
    if args.len() == 2 {
        let mut pick = Pick::seeded(args, fields.len() as u64);
        return Ok(if fields.is_empty() {
            Data::Nil
        } else {
            Data::Bulk(fields[pick.below(fields.len())].0.clone())
        });
    }
    let picked =
        super::set::pick_members(fields.len(), args.int(2)?, &mut Pick::seeded(args, fields.len() as u64));
    let mut out = Vec::new();
    for at in picked {
        out.push(Data::Bulk(fields[at].0.clone()));
        if with_values {
            out.push(Data::Bulk(fields[at].1.clone()));
        }
    }
    Ok(Data::Array(out))
}

fn hscan(args: &Args, slot: &Slot) -> Reply {
    let empty = Vec::new();
    let fields = slot.hash()?.unwrap_or(&empty);
    let no_values = args.from(3).iter().any(|arg| arg.eq_ignore_ascii_case(b"NOVALUES"));
    let (cursor, page) = super::scan_page(fields, args, 3, |(field, _)| field)?;
    let mut out = Vec::new();
    for (field, value) in page {
        out.push(Data::Bulk(field));
        if !no_values {
            out.push(Data::Bulk(value));
        }
    }
    Ok(Data::Array(vec![Data::bulk(cursor.to_string()), Data::Array(out)]))
}
