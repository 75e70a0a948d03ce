//! Sets, stored as their members sorted.

use std::collections::BTreeSet;

use bytes::Bytes;

use super::{Args, Data, Pick, Reply, Slot};

pub(super) fn run(name: &str, args: &Args, slot: &mut Slot) -> Option<Reply> {
    Some(match name {
        "sadd" => {
            let members = args.from(2);
            slot.set_mut()
                .map(|set| Data::Integer(members.iter().filter(|m| set.insert((*m).clone())).count() as i64))
        }
        "srem" => srem(args, slot),
        "smembers" => read(slot, |set| Data::bulks(set.iter().cloned())),
        "sismember" => read(slot, |set| Data::Integer(set.contains(args.get(2)) as i64)),
        "smismember" => read(slot, |set| {
            Data::Array(args.from(2).iter().map(|m| Data::Integer(set.contains(m) as i64)).collect())
        }),
        "scard" => read(slot, |set| Data::Integer(set.len() as i64)),
        "spop" => spop(args, slot),
        "srandmember" => srandmember(args, slot),
        "sscan" => sscan(args, slot),
        _ => return None,
    })
}

fn read(slot: &Slot, reply: impl FnOnce(&BTreeSet<Bytes>) -> Data) -> Reply {
    let empty = BTreeSet::new();
    Ok(reply(slot.set()?.unwrap_or(&empty)))
}

fn sscan(args: &Args, slot: &Slot) -> Reply {
    let members: Vec<Bytes> = slot.set()?.map(|set| set.iter().cloned().collect()).unwrap_or_default();
    let (cursor, page) = super::scan_page(&members, args, 3, |m| m)?;
    Ok(Data::Array(vec![Data::bulk(cursor.to_string()), Data::bulks(page)]))
}

fn srem(args: &Args, slot: &mut Slot) -> Reply {
    if slot.set()?.is_none() {
        return Ok(Data::Integer(0));
    }
    let set = slot.set_mut()?;
    Ok(Data::Integer(args.from(2).iter().filter(|m| set.remove(*m)).count() as i64))
}

/// Redis' count argument for SRANDMEMBER/HRANDFIELD/ZRANDMEMBER: positive picks distinct
/// members (at most all of them), negative picks `|count|` members with repeats. Indexes.
pub(super) fn pick_members(len: usize, count: i64, pick: &mut Pick) -> Vec<usize> {
    if len == 0 || count == 0 {
        return Vec::new();
    }
    if count < 0 {
        return (0..count.unsigned_abs().min(1 << 24)).map(|_| pick.below(len)).collect();
    }
    let wanted = (count as usize).min(len);
    let mut all: Vec<usize> = (0..len).collect();
    // Partial Fisher-Yates: the first `wanted` slots are a uniform sample.
    for at in 0..wanted {
        let other = at + pick.below(len - at);
        all.swap(at, other);
    }
    all.truncate(wanted);
    all
}

fn count_arg(args: &Args) -> Result<Option<i64>, String> {
    match args.len() {
        2 => Ok(None),
        3 => args.int(2).map(Some),
        _ => Err(super::syntax_error()),
    }
}

fn spop(args: &Args, slot: &mut Slot) -> Reply {
    let count = count_arg(args)?;
    if count.is_some_and(|c| c < 0) {
        return Err("ERR value is out of range, must be positive".into());
    }
    let Some(set) = slot.set()? else {
        return Ok(if count.is_some() { Data::Array(Vec::new()) } else { Data::Nil });
    };
    let members: Vec<Bytes> = set.iter().cloned().collect();
    let mut pick = Pick::seeded(args, members.len() as u64);
    let chosen: Vec<Bytes> = pick_members(members.len(), count.unwrap_or(1), &mut pick)
        .into_iter()
        .map(|at| members[at].clone())
        .collect();
    let set = slot.set_mut()?;
    for member in &chosen {
        set.remove(member);
    }
    Ok(match count {
        None => Data::optional(chosen.into_iter().next()),
        Some(_) => Data::bulks(chosen),
    })
}

fn srandmember(args: &Args, slot: &Slot) -> Reply {
    let count = count_arg(args)?;
    let empty = BTreeSet::new();
    let members: Vec<&Bytes> = slot.set()?.unwrap_or(&empty).iter().collect();
    let mut pick = Pick::seeded(args, members.len() as u64);
    let chosen = pick_members(members.len(), count.unwrap_or(1), &mut pick);
    Ok(match count {
        None => Data::optional(chosen.first().map(|at| members[*at].clone())),
        Some(_) => Data::bulks(chosen.into_iter().map(|at| members[at].clone())),
    })
}
