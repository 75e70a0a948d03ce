//! Sorted sets: stored as member -> score; ordered by (score, member) when read.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::{clamp_range, parse_float, syntax_error, Args, Data, Fail, Pick, Reply, Slot};

type Members = BTreeMap<Bytes, f64>;

pub(super) fn run(name: &str, args: &Args, slot: &mut Slot) -> Option<Reply> {
    Some(match name {
        "zadd" => zadd(args, slot),
        "zincrby" => {
            let delta = args.float(2);
            delta
                .and_then(|delta| add(slot, args.get(3), delta, Flags { incr: true, ..Flags::default() }))
                .map(|(_, _, score)| score.map_or(Data::Nil, Data::double))
        }
        "zrem" => zrem(args, slot),
        "zscore" => read(slot, |z| Ok(z.get(args.get(2)).map_or(Data::Nil, |s| Data::double(*s)))),
        "zmscore" => read(slot, |z| {
            Ok(Data::Array(
                args.from(2).iter().map(|m| z.get(m).map_or(Data::Nil, |s| Data::double(*s))).collect(),
            ))
        }),
        "zcard" => read(slot, |z| Ok(Data::Integer(z.len() as i64))),
        "zcount" => read(slot, |z| {
            let range = ScoreRange::parse(args.get(2), args.get(3))?;
            Ok(Data::Integer(z.values().filter(|s| range.contains(**s)).count() as i64))
        }),
        "zlexcount" => read(slot, |z| {
            let range = LexRange::parse(args.get(2), args.get(3))?;
            Ok(Data::Integer(z.keys().filter(|m| range.contains(m)).count() as i64))
        }),
        "zrange" => zrange(args, slot, Form::Generic),
        "zrangebyscore" => zrange(args, slot, Form::ByScore { rev: false }),
        "zrevrangebyscore" => zrange(args, slot, Form::ByScore { rev: true }),
        "zrangebylex" => zrange(args, slot, Form::ByLex { rev: false }),
        "zrevrangebylex" => zrange(args, slot, Form::ByLex { rev: true }),
        "zrevrange" => zrange(args, slot, Form::Rev),
        "zrank" | "zrevrank" => zrank(name == "zrevrank", args, slot),
        "zpopmin" | "zpopmax" => zpop(name == "zpopmax", args, slot),
        "zremrangebyscore" | "zremrangebyrank" | "zremrangebylex" => zremrange(name, args, slot),
        "zrandmember" => zrandmember(args, slot),
        "zscan" => read(slot, |z| {
            let members: Vec<(Bytes, f64)> = z.iter().map(|(m, s)| (m.clone(), *s)).collect();
            let (cursor, page) = super::scan_page(&members, args, 3, |(m, _)| m)?;
            Ok(Data::Array(vec![Data::bulk(cursor.to_string()), with_scores(page, true)]))
        }),
        _ => return None,
    })
}

fn read(slot: &Slot, reply: impl FnOnce(&Members) -> Reply) -> Reply {
    let empty = Members::new();
    reply(slot.zset()?.unwrap_or(&empty))
}

/// Members in (score, member) order.
fn ordered(members: &Members) -> Vec<(Bytes, f64)> {
    let mut all: Vec<(Bytes, f64)> = members.iter().map(|(m, s)| (m.clone(), *s)).collect();
    all.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
    all
}

fn with_scores(items: Vec<(Bytes, f64)>, scores: bool) -> Data {
    let mut out = Vec::with_capacity(items.len() * (1 + scores as usize));
    for (member, score) in items {
        out.push(Data::Bulk(member));
        if scores {
            out.push(Data::double(score));
        }
    }
    Data::Array(out)
}

#[derive(Default, Clone, Copy)]
struct Flags {
    nx: bool,
    xx: bool,
    gt: bool,
    lt: bool,
    ch: bool,
    incr: bool,
}

fn zadd(args: &Args, slot: &mut Slot) -> Reply {
    let mut flags = Flags::default();
    let mut at = 2;
    while at < args.len() {
        match args.word(at).as_str() {
            "NX" => flags.nx = true,
            "XX" => flags.xx = true,
            "GT" => flags.gt = true,
            "LT" => flags.lt = true,
            "CH" => flags.ch = true,
            "INCR" => flags.incr = true,
            _ => break,
        }
        at += 1;
    }
    let pairs = args.from(at);
    if pairs.is_empty() || !pairs.len().is_multiple_of(2) {
        return Err(syntax_error());
    }
    if flags.nx && flags.xx {
        return Err("ERR XX and NX options at the same time are not compatible".into());
    }
    if (flags.nx && (flags.gt || flags.lt)) || (flags.gt && flags.lt) {
        return Err("ERR GT, LT, and/or NX options at the same time are not compatible".into());
    }
    if flags.incr && pairs.len() > 2 {
        return Err("ERR INCR option supports a single increment-element pair".into());
    }
    let scores: Vec<f64> = pairs.chunks(2).map(|pair| parse_float(&pair[0])).collect::<Result<_, _>>()?;
    let (mut added, mut changed, mut last) = (0, 0, None);
    for (pair, score) in pairs.chunks(2).zip(scores) {
        let (was_added, was_changed, new) = add(slot, &pair[1], score, flags)?;
        added += was_added as i64;
        changed += was_changed as i64;
        last = new;
    }
    Ok(match (flags.incr, flags.ch) {
        (true, _) => last.map_or(Data::Nil, Data::double),
        (false, true) => Data::Integer(added + changed),
        (false, false) => Data::Integer(added),
    })
}

/// Add or update one member: (added, updated, the score it has now or `None` if refused).
fn add(slot: &mut Slot, member: &Bytes, score: f64, flags: Flags) -> Result<(bool, bool, Option<f64>), Fail> {
    let old = slot.zset()?.and_then(|z| z.get(member).copied());
    let new = match (old, flags.incr) {
        (Some(old), true) => old + score,
        _ => score,
    };
    if new.is_nan() {
        return Err("ERR resulting score is not a number (NaN)".into());
    }
    let refused = match old {
        None => flags.xx,
        Some(old) => flags.nx || (flags.gt && new <= old) || (flags.lt && new >= old),
    };
    if refused {
        return Ok((false, false, None));
    }
    slot.zset_mut()?.insert(member.clone(), new);
    Ok((old.is_none(), old.is_some_and(|old| old != new), Some(new)))
}

fn zrem(args: &Args, slot: &mut Slot) -> Reply {
    if slot.zset()?.is_none() {
        return Ok(Data::Integer(0));
    }
    let z = slot.zset_mut()?;
    Ok(Data::Integer(args.from(2).iter().filter(|m| z.remove(*m).is_some()).count() as i64))
}

/// `min max` of a score range: `(` excludes, `-inf`/`+inf`.
#[derive(Clone, Copy)]
struct ScoreRange {
    min: f64,
    min_open: bool,
    max: f64,
    max_open: bool,
}

impl ScoreRange {
    fn bound(arg: &[u8]) -> Result<(f64, bool), Fail> {
        let fail = || "ERR min or max is not a float".to_string();
        match arg.strip_prefix(b"(") {
            Some(rest) => Ok((parse_float(rest).map_err(|_| fail())?, true)),
            None => Ok((parse_float(arg).map_err(|_| fail())?, false)),
        }
    }
    fn parse(min: &[u8], max: &[u8]) -> Result<ScoreRange, Fail> {
        let ((min, min_open), (max, max_open)) = (Self::bound(min)?, Self::bound(max)?);
        Ok(ScoreRange { min, min_open, max, max_open })
    }
    fn contains(&self, score: f64) -> bool {
        let above = if self.min_open { score > self.min } else { score >= self.min };
        let below = if self.max_open { score < self.max } else { score <= self.max };
        above && below
    }
}

/// `min max` of a lexicographic range: `[` includes, `(` excludes, `-` and `+` are the ends.
struct LexRange {
    min: LexBound,
    max: LexBound,
}

enum LexBound {
    Lowest,
    Highest,
    Inclusive(Bytes),
    Exclusive(Bytes),
}

impl LexRange {
    fn bound(arg: &Bytes) -> Result<LexBound, Fail> {
        match arg.first() {
            Some(b'-') if arg.len() == 1 => Ok(LexBound::Lowest),
            Some(b'+') if arg.len() == 1 => Ok(LexBound::Highest),
            Some(b'[') => Ok(LexBound::Inclusive(arg.slice(1..))),
            Some(b'(') => Ok(LexBound::Exclusive(arg.slice(1..))),
            _ => Err("ERR min or max not valid string range item".into()),
        }
    }
    fn parse(min: &Bytes, max: &Bytes) -> Result<LexRange, Fail> {
        Ok(LexRange { min: Self::bound(min)?, max: Self::bound(max)? })
    }
    fn contains(&self, member: &Bytes) -> bool {
        let above = match &self.min {
            LexBound::Lowest => true,
            LexBound::Highest => false,
            LexBound::Inclusive(bound) => member >= bound,
            LexBound::Exclusive(bound) => member > bound,
        };
        let below = match &self.max {
            LexBound::Lowest => false,
            LexBound::Highest => true,
            LexBound::Inclusive(bound) => member <= bound,
            LexBound::Exclusive(bound) => member < bound,
        };
        above && below
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    /// ZRANGE with its options.
    Generic,
    ByScore {
        rev: bool,
    },
    ByLex {
        rev: bool,
    },
    /// ZREVRANGE.
    Rev,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum By {
    Rank,
    Score,
    Lex,
}

fn zrange(args: &Args, slot: &Slot, form: Form) -> Reply {
    let (mut by, mut rev) = match form {
        Form::Generic => (By::Rank, false),
        Form::ByScore { rev } => (By::Score, rev),
        Form::ByLex { rev } => (By::Lex, rev),
        Form::Rev => (By::Rank, true),
    };
    let (mut scores, mut limit) = (false, None);
    let mut at = 4;
    while at < args.len() {
        match args.word(at).as_str() {
            "WITHSCORES" if form != (Form::ByLex { rev }) => scores = true,
            "BYSCORE" if form == Form::Generic && by == By::Rank => by = By::Score,
            "BYLEX" if form == Form::Generic && by == By::Rank => by = By::Lex,
            "REV" if form == Form::Generic => rev = true,
            "LIMIT" if at + 2 < args.len() && !matches!(form, Form::Rev) => {
                limit = Some((args.int(at + 1)?, args.int(at + 2)?));
                at += 2;
            }
            _ => return Err(syntax_error()),
        }
        at += 1;
    }
    if limit.is_some() && by == By::Rank {
        return Err(
            "ERR syntax error, LIMIT is only supported in combination with either BYSCORE or BYLEX".into()
        );
    }
    if scores && by == By::Lex {
        return Err("ERR syntax error, WITHSCORES not supported in combination with BYLEX".into());
    }
    // Reversed score and lex ranges name the high end first.
    let (low, high) =
        if rev && by != By::Rank { (args.get(3), args.get(2)) } else { (args.get(2), args.get(3)) };
    let empty = Members::new();
    let z = slot.zset()?.unwrap_or(&empty);
    let mut all = ordered(z);
    if rev {
        all.reverse();
    }
    let picked: Vec<(Bytes, f64)> = match by {
        By::Rank => {
            let (start, stop) = (super::parse_int(low)?, super::parse_int(high)?);
            match clamp_range(start, stop, all.len()) {
                Some((from, to)) => all[from..=to].to_vec(),
                None => Vec::new(),
            }
        }
        By::Score => {
            let range = ScoreRange::parse(low, high)?;
            page(all.into_iter().filter(|(_, s)| range.contains(*s)), limit)
        }
        By::Lex => {
            let range = LexRange::parse(low, high)?;
            page(all.into_iter().filter(|(m, _)| range.contains(m)), limit)
        }
    };
    Ok(with_scores(picked, scores))
}

/// LIMIT offset count (a negative count: all the rest).
fn page(items: impl Iterator<Item = (Bytes, f64)>, limit: Option<(i64, i64)>) -> Vec<(Bytes, f64)> {
    match limit {
        None => items.collect(),
        Some((offset, _)) if offset < 0 => Vec::new(),
        Some((offset, count)) => {
            let count = if count < 0 { usize::MAX } else { count as usize };
            items.skip(offset as usize).take(count).collect()
        }
    }
}

fn zrank(rev: bool, args: &Args, slot: &Slot) -> Reply {
    let with_score = match args.len() {
        3 => false,
        4 if args.word(3) == "WITHSCORE" => true,
        _ => return Err(syntax_error()),
    };
    read(slot, |z| {
        let mut all = ordered(z);
        if rev {
            all.reverse();
        }
        Ok(match all.iter().position(|(m, _)| m == args.get(2)) {
            None if with_score => Data::NilArray,
            None => Data::Nil,
            Some(rank) if with_score => {
                Data::Array(vec![Data::Integer(rank as i64), Data::double(all[rank].1)])
            }
            Some(rank) => Data::Integer(rank as i64),
        })
    })
}

fn zpop(max: bool, args: &Args, slot: &mut Slot) -> Reply {
    let count = match args.len() {
        2 => 1,
        3 => usize::try_from(args.int(2)?)
            .map_err(|_| "ERR value is out of range, must be positive".to_string())?,
        _ => return Err(syntax_error()),
    };
    let Some(z) = slot.zset()? else { return Ok(Data::Array(Vec::new())) };
    let mut all = ordered(z);
    if max {
        all.reverse();
    }
    all.truncate(count);
    let z = slot.zset_mut()?;
    for (member, _) in &all {
        z.remove(member);
    }
    Ok(with_scores(all, true))
}

fn zremrange(name: &str, args: &Args, slot: &mut Slot) -> Reply {
    let Some(z) = slot.zset()? else {
        // Arguments are still checked on a missing key, as Redis does.
        match name {
            "zremrangebyscore" => drop(ScoreRange::parse(args.get(2), args.get(3))?),
            "zremrangebylex" => drop(LexRange::parse(args.get(2), args.get(3))?),
            _ => drop((args.int(2)?, args.int(3)?)),
        }
        return Ok(Data::Integer(0));
    };
    let all = ordered(z);
    let doomed: Vec<Bytes> = match name {
        "zremrangebyscore" => {
            let range = ScoreRange::parse(args.get(2), args.get(3))?;
            all.into_iter().filter(|(_, s)| range.contains(*s)).map(|(m, _)| m).collect()
        }
        "zremrangebylex" => {
            let range = LexRange::parse(args.get(2), args.get(3))?;
            all.into_iter().filter(|(m, _)| range.contains(m)).map(|(m, _)| m).collect()
        }
        _ => match clamp_range(args.int(2)?, args.int(3)?, all.len()) {
            Some((from, to)) => all[from..=to].iter().map(|(m, _)| m.clone()).collect(),
            None => Vec::new(),
        },
    };
    let z = slot.zset_mut()?;
    for member in &doomed {
        z.remove(member);
    }
    Ok(Data::Integer(doomed.len() as i64))
}

fn zrandmember(args: &Args, slot: &Slot) -> Reply {
    let scores = match args.len() {
        2 | 3 => false,
        4 if args.word(3) == "WITHSCORES" => true,
        _ => return Err(syntax_error()),
    };
    read(slot, |z| {
        let all: Vec<(Bytes, f64)> = z.iter().map(|(m, s)| (m.clone(), *s)).collect();
        let mut pick = Pick::seeded(args, all.len() as u64);
        if args.len() == 2 {
            return Ok(if all.is_empty() {
                Data::Nil
            } else {
                Data::Bulk(all[pick.below(all.len())].0.clone())
            });
        }
        let chosen = super::set::pick_members(all.len(), args.int(2)?, &mut pick);
        Ok(with_scores(chosen.into_iter().map(|at| all[at].clone()).collect(), scores))
    })
}
