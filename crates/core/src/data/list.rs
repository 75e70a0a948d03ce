//! Lists, stored as one vector of elements.

use bytes::Bytes;

use super::{clamp_range, Args, Data, Reply, Slot};

pub(super) fn run(name: &str, args: &Args, slot: &mut Slot) -> Option<Reply> {
    Some(match name {
        "lpush" | "rpush" => push(name == "lpush", args, slot),
        "lpushx" | "rpushx" => match slot.list() {
            Ok(None) => Ok(Data::Integer(0)),
            Ok(Some(_)) => push(name == "lpushx", args, slot),
            Err(fail) => Err(fail),
        },
        "lpop" | "rpop" => pop(name == "lpop", args, slot),
        "lrange" => lrange(args, slot),
        "llen" => slot.list().map(|items| Data::Integer(items.map_or(0, |items| items.len() as i64))),
        "lindex" => lindex(args, slot),
        "lset" => lset(args, slot),
        "lrem" => lrem(args, slot),
        "ltrim" => ltrim(args, slot),
        "linsert" => linsert(args, slot),
        "lpos" => lpos(args, slot),
        _ => return None,
    })
}

fn push(front: bool, args: &Args, slot: &mut Slot) -> Reply {
    let items = slot.list_mut()?;
    for item in args.from(2) {
        if front {
            items.insert(0, item.clone());
        } else {
            items.push(item.clone());
        }
    }
    Ok(Data::Integer(items.len() as i64))
}

fn pop(front: bool, args: &Args, slot: &mut Slot) -> Reply {
    let count = match args.len() {
        2 => None,
        3 => Some(
            usize::try_from(args.int(2)?)
                .map_err(|_| "ERR value is out of range, must be positive".to_string())?,
        ),
        _ => return Err(super::syntax_error()),
    };
    if slot.list()?.is_none() {
        return Ok(if count.is_some() { Data::NilArray } else { Data::Nil });
    }
    let items = slot.list_mut()?;
    let take = count.unwrap_or(1).min(items.len());
    let popped: Vec<Bytes> =
        if front { items.drain(..take).collect() } else { items.drain(items.len() - take..).rev().collect() };
    Ok(match count {
        None => Data::optional(popped.into_iter().next()),
        Some(_) => Data::bulks(popped),
    })
}

fn lrange(args: &Args, slot: &Slot) -> Reply {
    let (start, stop) = (args.int(2)?, args.int(3)?);
    let Some(items) = slot.list()? else { return Ok(Data::Array(Vec::new())) };
    Ok(match clamp_range(start, stop, items.len()) {
        Some((from, to)) => Data::bulks(items[from..=to].iter().cloned()),
        None => Data::Array(Vec::new()),
    })
}

/// A possibly negative index into `len` elements.
fn index(at: i64, len: usize) -> Option<usize> {
    let at = if at < 0 { len as i64 + at } else { at };
    (0..len as i64).contains(&at).then_some(at as usize)
}

fn lindex(args: &Args, slot: &Slot) -> Reply {
    let at = args.int(2)?;
    let Some(items) = slot.list()? else { return Ok(Data::Nil) };
    Ok(Data::optional(index(at, items.len()).map(|at| items[at].clone())))
}

fn lset(args: &Args, slot: &mut Slot) -> Reply {
    let at = args.int(2)?;
    if slot.list()?.is_none() {
        return Err("ERR no such key".into());
    }
    let items = slot.list_mut()?;
    let at = index(at, items.len()).ok_or("ERR index out of range")?;
    items[at] = args.get(3).clone();
    Ok(Data::ok())
}

fn lrem(args: &Args, slot: &mut Slot) -> Reply {
    let count = args.int(2)?;
    if slot.list()?.is_none() {
        return Ok(Data::Integer(0));
    }
    let items = slot.list_mut()?;
    let target = args.get(3);
    let limit = if count == 0 { usize::MAX } else { count.unsigned_abs() as usize };
    let mut removed = 0;
    if count >= 0 {
        items.retain(|item| {
            let drop = removed < limit && item == target;
            removed += drop as usize;
            !drop
        });
    } else {
        let mut at = items.len();
        while at > 0 && removed < limit {
            at -= 1;
            if items[at] == target {
                items.remove(at);
                removed += 1;
            }
        }
    }
    Ok(Data::Integer(removed as i64))
}

fn ltrim(args: &Args, slot: &mut Slot) -> Reply {
    let (start, stop) = (args.int(2)?, args.int(3)?);
    if slot.list()?.is_none() {
        return Ok(Data::ok());
    }
    let items = slot.list_mut()?;
    match clamp_range(start, stop, items.len()) {
        Some((from, to)) => {
            items.truncate(to + 1);
            items.drain(..from);
        }
        None => items.clear(),
    }
    Ok(Data::ok())
}

fn linsert(args: &Args, slot: &mut Slot) -> Reply {
    let after = match args.word(2).as_str() {
        "BEFORE" => false,
        "AFTER" => true,
        _ => return Err(super::syntax_error()),
    };
    if slot.list()?.is_none() {
        return Ok(Data::Integer(0));
    }
    let items = slot.list_mut()?;
    let Some(at) = items.iter().position(|item| item == args.get(3)) else { return Ok(Data::Integer(-1)) };
    items.insert(at + after as usize, args.get(4).clone());
    Ok(Data::Integer(items.len() as i64))
}

fn lpos(args: &Args, slot: &Slot) -> Reply {
    let (mut rank, mut count, mut maxlen) = (1i64, None, 0usize);
    let mut at = 3;
    while at < args.len() {
        if at + 1 >= args.len() {
            return Err(super::syntax_error());
        }
        match args.word(at).as_str() {
            "RANK" => {
                rank = args.int(at + 1)?;
                if rank == 0 || rank == i64::MIN {
                    return Err("ERR RANK can't be zero: use 1 to start from the first match, 2 from the second ... or use negative to start from the end of the list".into());
                }
            }
            "COUNT" => {
                count = Some(
                    usize::try_from(args.int(at + 1)?)
                        .map_err(|_| "ERR COUNT can't be negative".to_string())?,
                )
            }
            "MAXLEN" => {
                maxlen = usize::try_from(args.int(at + 1)?)
                    .map_err(|_| "ERR MAXLEN can't be negative".to_string())?
            }
            _ => return Err(super::syntax_error()),
        }
        at += 2;
    }
    let empty = Vec::new();
    let items = slot.list()?.unwrap_or(&empty);
    let positions = matches(
        items,
        args.get(2),
        rank,
        count.map(|c| if c == 0 { usize::MAX } else { c }).unwrap_or(1),
        maxlen,
    );
    Ok(match count {
        Some(_) => Data::Array(positions.into_iter().map(|p| Data::Integer(p as i64)).collect()),
        None => positions.first().map_or(Data::Nil, |p| Data::Integer(*p as i64)),
    })
}

/// Indexes of `target`, skipping the first `rank - 1` matches (from the end if negative).
fn matches(items: &[Bytes], target: &Bytes, rank: i64, wanted: usize, maxlen: usize) -> Vec<usize> {
    let scan = if maxlen == 0 { items.len() } else { maxlen.min(items.len()) };
    let order: Box<dyn Iterator<Item = usize>> =
        if rank > 0 { Box::new(0..scan) } else { Box::new((items.len() - scan..items.len()).rev()) };
    order.filter(|at| items[*at] == target).skip(rank.unsigned_abs() as usize - 1).take(wanted).collect()
}
