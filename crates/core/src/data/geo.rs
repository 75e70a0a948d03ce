//! GEO commands on sorted sets, as Redis stores them: a member's score is its 52-bit
//! interleaved geohash, so positions, hashes and distances match Redis' to the last digit.
//! Searches scan every member (exact, like Redis' per-point check after its box lookup).

use bytes::Bytes;

use super::{parse_float, syntax_error, Args, Data, Fail, Reply, Slot};

const STEP_BITS: u32 = 26;
const LAT_MIN: f64 = -85.05112878;
const LAT_MAX: f64 = 85.05112878;
const LON_MIN: f64 = -180.0;
const LON_MAX: f64 = 180.0;
const EARTH_RADIUS_M: f64 = 6372797.560856;
const ALPHABET: &[u8; 32] = b"0123456789bcdefghjkmnpqrstuvwxyz";

pub(super) fn run(name: &str, args: &Args, slot: &mut Slot) -> Option<Reply> {
    Some(match name {
        "geoadd" => geoadd(args, slot),
        "geopos" => read(slot, |points| {
            Ok(Data::Array(
                args.from(2)
                    .iter()
                    .map(|member| match points.position(member) {
                        Some((lon, lat)) => Data::Array(vec![Data::double(lon), Data::double(lat)]),
                        None => Data::NilArray,
                    })
                    .collect(),
            ))
        }),
        "geodist" => geodist(args, slot),
        "geohash" => read(slot, |points| {
            Ok(Data::Array(
                args.from(2)
                    .iter()
                    .map(|member| points.position(member).map_or(Data::Nil, text_hash))
                    .collect(),
            ))
        }),
        "geosearch" => search(args, slot, Origin::Search),
        "georadius" | "georadius_ro" => search(args, slot, Origin::Radius),
        "georadiusbymember" | "georadiusbymember_ro" => search(args, slot, Origin::RadiusByMember),
        _ => return None,
    })
}

/// The members of the key's sorted set, read as positions.
struct Points<'a>(&'a std::collections::BTreeMap<Bytes, f64>);

impl Points<'_> {
    fn position(&self, member: &Bytes) -> Option<(f64, f64)> {
        self.0.get(member).map(|score| decode(*score as u64))
    }
}

fn read(slot: &Slot, reply: impl FnOnce(&Points) -> Reply) -> Reply {
    let empty = Default::default();
    reply(&Points(slot.zset()?.unwrap_or(&empty)))
}

fn spread(value: u32) -> u64 {
    let mut x = value as u64;
    x = (x | (x << 16)) & 0x0000_FFFF_0000_FFFF;
    x = (x | (x << 8)) & 0x00FF_00FF_00FF_00FF;
    x = (x | (x << 4)) & 0x0F0F_0F0F_0F0F_0F0F;
    x = (x | (x << 2)) & 0x3333_3333_3333_3333;
    (x | (x << 1)) & 0x5555_5555_5555_5555
}

fn squash(bits: u64) -> u32 {
    let mut x = bits & 0x5555_5555_5555_5555;
    x = (x | (x >> 1)) & 0x3333_3333_3333_3333;
    x = (x | (x >> 2)) & 0x0F0F_0F0F_0F0F_0F0F;
    x = (x | (x >> 4)) & 0x00FF_00FF_00FF_00FF;
    x = (x | (x >> 8)) & 0x0000_FFFF_0000_FFFF;
    ((x | (x >> 16)) & 0x0000_0000_FFFF_FFFF) as u32
}

/// Redis' geohashEncode: latitude bits at even positions, longitude at odd.
fn encode_in(lon: f64, lat: f64, lat_min: f64, lat_max: f64) -> u64 {
    let cells = (1u64 << STEP_BITS) as f64;
    let lat_offset = (lat - lat_min) / (lat_max - lat_min) * cells;
    let lon_offset = (lon - LON_MIN) / (LON_MAX - LON_MIN) * cells;
    spread(lat_offset as u32) | (spread(lon_offset as u32) << 1)
}

/// The centre of the hash's cell, clamped to the valid range (Redis' geohashDecodeToLongLatWGS84).
fn decode(bits: u64) -> (f64, f64) {
    let cells = (1u64 << STEP_BITS) as f64;
    let (lat_cell, lon_cell) = (squash(bits) as f64, squash(bits >> 1) as f64);
    let lat_scale = LAT_MAX - LAT_MIN;
    let lon_scale = LON_MAX - LON_MIN;
    let lat = (LAT_MIN + lat_cell / cells * lat_scale + LAT_MIN + (lat_cell + 1.0) / cells * lat_scale) / 2.0;
    let lon = (LON_MIN + lon_cell / cells * lon_scale + LON_MIN + (lon_cell + 1.0) / cells * lon_scale) / 2.0;
    (lon.clamp(LON_MIN, LON_MAX), lat.clamp(LAT_MIN, LAT_MAX))
}

/// GEOHASH's 11-character text: the position re-encoded over the standard -90..90 range.
fn text_hash((lon, lat): (f64, f64)) -> Data {
    let bits = encode_in(lon, lat, -90.0, 90.0);
    let text: Vec<u8> = (0..11)
        .map(|at| if at == 10 { 0 } else { ((bits >> (52 - (at + 1) * 5)) & 0x1f) as usize })
        .map(|index| ALPHABET[index])
        .collect();
    Data::bulk(text)
}

fn distance_m((lon1, lat1): (f64, f64), (lon2, lat2): (f64, f64)) -> f64 {
    let (lat1, lon1, lat2, lon2) =
        (lat1.to_radians(), lon1.to_radians(), lat2.to_radians(), lon2.to_radians());
    let u = ((lat2 - lat1) / 2.0).sin();
    let v = ((lon2 - lon1) / 2.0).sin();
    2.0 * EARTH_RADIUS_M * (u * u + lat1.cos() * lat2.cos() * v * v).sqrt().asin()
}

fn unit_m(arg: &[u8]) -> Result<f64, Fail> {
    Ok(match arg.to_ascii_lowercase().as_slice() {
        b"m" => 1.0,
        b"km" => 1000.0,
        b"ft" => 0.3048,
        b"mi" => 1609.34,
        _ => return Err("ERR unsupported unit provided. please use M, KM, FT, MI".into()),
    })
}

fn coordinates(lon: &[u8], lat: &[u8]) -> Result<(f64, f64), Fail> {
    let (lon, lat) = (parse_float(lon)?, parse_float(lat)?);
    if !(LON_MIN..=LON_MAX).contains(&lon) || !(LAT_MIN..=LAT_MAX).contains(&lat) {
        return Err(format!("ERR invalid longitude,latitude pair {lon:.6},{lat:.6}"));
    }
    Ok((lon, lat))
}

fn geoadd(args: &Args, slot: &mut Slot) -> Reply {
    let (mut nx, mut xx, mut ch, mut at) = (false, false, false, 2);
    while at < args.len() {
        match args.word(at).as_str() {
            "NX" => nx = true,
            "XX" => xx = true,
            "CH" => ch = true,
            _ => break,
        }
        at += 1;
    }
    let triples = args.from(at);
    if triples.is_empty() || !triples.len().is_multiple_of(3) {
        return Err(syntax_error());
    }
    if nx && xx {
        return Err("ERR XX and NX options at the same time are not compatible".into());
    }
    let scored: Vec<(Bytes, f64)> = triples
        .chunks(3)
        .map(|t| {
            coordinates(&t[0], &t[1])
                .map(|(lon, lat)| (t[2].clone(), encode_in(lon, lat, LAT_MIN, LAT_MAX) as f64))
        })
        .collect::<Result<_, _>>()?;
    let members = slot.zset_mut()?;
    let (mut added, mut changed) = (0, 0);
    for (member, score) in scored {
        let old = members.get(&member).copied();
        if (old.is_some() && nx) || (old.is_none() && xx) {
            continue;
        }
        added += old.is_none() as i64;
        changed += old.is_some_and(|old| old != score) as i64;
        members.insert(member, score);
    }
    Ok(Data::Integer(if ch { added + changed } else { added }))
}

fn geodist(args: &Args, slot: &Slot) -> Reply {
    let unit = match args.len() {
        4 => 1.0,
        5 => unit_m(args.get(4))?,
        _ => return Err(syntax_error()),
    };
    read(slot, |points| {
        Ok(match (points.position(args.get(2)), points.position(args.get(3))) {
            (Some(a), Some(b)) => Data::bulk(format!("{:.4}", distance_m(a, b) / unit)),
            _ => Data::Nil,
        })
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// GEOSEARCH: FROMMEMBER/FROMLONLAT and BYRADIUS/BYBOX as options.
    Search,
    /// GEORADIUS key lon lat radius unit ...
    Radius,
    /// GEORADIUSBYMEMBER key member radius unit ...
    RadiusByMember,
}

enum Shape {
    Radius(f64),
    Box { width_m: f64, height_m: f64 },
}

struct Query {
    center: Option<(f64, f64)>,
    from_member: Option<Bytes>,
    shape: Option<Shape>,
    unit_m: f64,
    ascending: Option<bool>,
    count: Option<(usize, bool)>,
    with_coord: bool,
    with_dist: bool,
    with_hash: bool,
}

fn parse_query(args: &Args, origin: Origin) -> Result<Query, Fail> {
    let mut query = Query {
        center: None,
        from_member: None,
        shape: None,
        unit_m: 1.0,
        ascending: None,
        count: None,
        with_coord: false,
        with_dist: false,
        with_hash: false,
    };
    let mut at = match origin {
        Origin::Search => 2,
        Origin::Radius => {
            query.center = Some(coordinates(args.get(2), args.get(3))?);
            4
        }
        Origin::RadiusByMember => {
            query.from_member = Some(args.get(2).clone());
            3
        }
    };
    if origin != Origin::Search {
        if args.len() < at + 2 {
            return Err(syntax_error());
        }
        query.shape = Some(Shape::Radius(non_negative(args.get(at))?));
        query.unit_m = unit_m(args.get(at + 1))?;
        at += 2;
    }
    let need = |at: usize, n: usize| if at + n < args.len() { Ok(()) } else { Err(syntax_error()) };
    while at < args.len() {
        match args.word(at).as_str() {
            "FROMMEMBER" if origin == Origin::Search => {
                need(at, 1)?;
                query.from_member = Some(args.get(at + 1).clone());
                at += 1;
            }
            "FROMLONLAT" if origin == Origin::Search => {
                need(at, 2)?;
                query.center = Some(coordinates(args.get(at + 1), args.get(at + 2))?);
                at += 2;
            }
            "BYRADIUS" if origin == Origin::Search => {
                need(at, 2)?;
                query.shape = Some(Shape::Radius(non_negative(args.get(at + 1))?));
                query.unit_m = unit_m(args.get(at + 2))?;
                at += 2;
            }
            "BYBOX" if origin == Origin::Search => {
                need(at, 3)?;
                let (width_m, height_m) = (non_negative(args.get(at + 1))?, non_negative(args.get(at + 2))?);
                query.unit_m = unit_m(args.get(at + 3))?;
                query.shape = Some(Shape::Box { width_m, height_m });
                at += 3;
            }
            "ASC" => query.ascending = Some(true),
            "DESC" => query.ascending = Some(false),
            "COUNT" => {
                need(at, 1)?;
                let count = super::parse_int(args.get(at + 1))?;
                if count <= 0 {
                    return Err("ERR COUNT must be > 0".into());
                }
                let any = at + 2 < args.len() && args.word(at + 2) == "ANY";
                query.count = Some((count as usize, any));
                at += 1 + any as usize;
            }
            "WITHCOORD" => query.with_coord = true,
            "WITHDIST" => query.with_dist = true,
            "WITHHASH" => query.with_hash = true,
            "STORE" | "STOREDIST" => return Err(
                "ERR GEORADIUS ... STORE is not supported by chorus: run the search, then ZADD the results"
                    .into(),
            ),
            _ => return Err(syntax_error()),
        }
        at += 1;
    }
    if origin == Origin::Search {
        match (&query.center, &query.from_member) {
            (None, None) => {
                return Err(
                    "ERR exactly one of FROMMEMBER or FROMLONLAT can be specified for GEOSEARCH".into()
                )
            }
            (Some(_), Some(_)) => {
                return Err(
                    "ERR exactly one of FROMMEMBER or FROMLONLAT can be specified for GEOSEARCH".into()
                )
            }
            _ => {}
        }
        if query.shape.is_none() {
            return Err("ERR exactly one of BYRADIUS and BYBOX can be specified for GEOSEARCH".into());
        }
    }
    Ok(query)
}

fn non_negative(arg: &[u8]) -> Result<f64, Fail> {
    let value = parse_float(arg)?;
    if value < 0.0 {
        return Err("ERR radius cannot be negative".into());
    }
    Ok(value)
}

/// The members a GEOSEARCH / GEORADIUS / GEORADIUSBYMEMBER command (`args`, name first,
/// without STORE options) finds in `members`: (member, distance in the query's unit, score),
/// in the reply's order. For the STORE forms, which the server runs over two keys.
pub fn search_members(
    args: &[Bytes],
    members: &std::collections::BTreeMap<Bytes, f64>,
) -> Result<Vec<(Bytes, f64, f64)>, Fail> {
    let args = Args { all: args };
    let origin = match args.word(0).as_str() {
        "GEOSEARCH" => Origin::Search,
        "GEORADIUS" | "GEORADIUS_RO" => Origin::Radius,
        _ => Origin::RadiusByMember,
    };
    let query = parse_query(&args, origin)?;
    let found = find(&query, &Points(members))?;
    Ok(found
        .into_iter()
        .map(|(member, distance_m, score)| (member, distance_m / query.unit_m, score))
        .collect())
}

fn search(args: &Args, slot: &Slot, origin: Origin) -> Reply {
    let query = parse_query(args, origin)?;
    read(slot, |points| {
        let found = find(&query, points)?;
        let plain = !(query.with_coord || query.with_dist || query.with_hash);
        Ok(Data::Array(
            found
                .into_iter()
                .map(|(member, distance, score)| {
                    if plain {
                        return Data::Bulk(member);
                    }
                    let mut item = vec![Data::Bulk(member)];
                    if query.with_dist {
                        item.push(Data::bulk(format!("{:.4}", distance / query.unit_m)));
                    }
                    if query.with_hash {
                        item.push(Data::Integer(score as i64));
                    }
                    if query.with_coord {
                        let (lon, lat) = decode(score as u64);
                        item.push(Data::Array(vec![Data::double(lon), Data::double(lat)]));
                    }
                    Data::Array(item)
                })
                .collect(),
        ))
    })
}

/// (member, distance in m, score) of the members the query finds, in the reply's order.
fn find(query: &Query, points: &Points) -> Result<Vec<(Bytes, f64, f64)>, Fail> {
    {
        let center = match (&query.center, &query.from_member) {
            (Some(center), _) => *center,
            (None, Some(member)) => points
                .position(member)
                .ok_or_else(|| "ERR could not decode requested zset member".to_string())?,
            (None, None) => return Err(syntax_error()),
        };
        let shape = query.shape.as_ref().ok_or_else(syntax_error)?;
        // (member, distance in m, score), in score order: Redis' order when unsorted.
        let mut found: Vec<(Bytes, f64, f64)> = Vec::new();
        let mut by_score: Vec<(&Bytes, f64)> = points.0.iter().map(|(m, s)| (m, *s)).collect();
        by_score.sort_by(|a, b| a.1.total_cmp(&b.1).then_with(|| a.0.cmp(b.0)));
        for (member, score) in by_score {
            let point = decode(score as u64);
            let inside = match shape {
                Shape::Radius(radius) => {
                    let distance = distance_m(center, point);
                    (distance <= radius * query.unit_m).then_some(distance)
                }
                Shape::Box { width_m, height_m } => {
                    let lat_distance = EARTH_RADIUS_M * (point.1.to_radians() - center.1.to_radians()).abs();
                    let lon_distance = distance_m((point.0, point.1), (center.0, point.1));
                    (lat_distance <= height_m * query.unit_m / 2.0
                        && lon_distance <= width_m * query.unit_m / 2.0)
                        .then(|| distance_m(center, point))
                }
            };
            if let Some(distance) = inside {
                found.push((member.clone(), distance, score));
                if query.count.is_some_and(|(count, any)| any && found.len() >= count) {
                    break;
                }
            }
        }
        let ascending = query.ascending.or(query.count.filter(|(_, any)| !any).map(|_| true));
        if let Some(ascending) = ascending {
            found.sort_by(|a, b| a.1.total_cmp(&b.1));
            if !ascending {
                found.reverse();
            }
        }
        if let Some((count, _)) = query.count {
            found.truncate(count);
        }
        Ok(found)
    }
}
