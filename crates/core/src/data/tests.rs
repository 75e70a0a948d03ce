use super::*;

fn b(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// One key's register and a clock: runs commands as the replicas would.
struct Key {
    value: Option<Bytes>,
    now_ms: u64,
}

impl Key {
    fn new() -> Key {
        Key { value: None, now_ms: 1_000_000 }
    }
    fn run(&mut self, line: &str) -> Data {
        self.run_args(line.split(' ').map(b).collect())
    }
    fn run_args(&mut self, args: Vec<Bytes>) -> Data {
        let op = ExecOp { now_ms: self.now_ms, bytes_max: 1 << 20, args };
        let effect = apply(&op, self.value.as_ref());
        if let Some(write) = effect.write {
            self.value = write;
        }
        match effect.outcome {
            Outcome::Data(data) => data,
            other => panic!("typed command answered {other:?}"),
        }
    }
}

fn int(n: i64) -> Data {
    Data::Integer(n)
}
fn bulks(items: &[&str]) -> Data {
    Data::Array(items.iter().map(Data::bulk).collect())
}
fn err(line: &str) -> Data {
    Data::Error(line.into())
}

#[test]
fn lists_push_pop_range_and_edit() {
    let mut key = Key::new();
    assert_eq!(key.run("RPUSH l a b c"), int(3));
    assert_eq!(key.run("LPUSH l z"), int(4));
    assert_eq!(key.run("LRANGE l 0 -1"), bulks(&["z", "a", "b", "c"]));
    assert_eq!(key.run("LPOP l 2"), bulks(&["z", "a"]));
    assert_eq!(key.run("RPOP l"), Data::bulk("c"));
    assert_eq!(key.run("LINSERT l BEFORE b x"), int(2));
    assert_eq!(key.run("LINDEX l -1"), Data::bulk("b"));
    assert_eq!(key.run("LSET l 0 y"), Data::ok());
    assert_eq!(key.run("LSET l 9 y"), err("ERR index out of range"));
    assert_eq!(key.run("RPUSH l y y"), int(4));
    assert_eq!(key.run("LPOS l y RANK -1"), int(3));
    assert_eq!(key.run("LREM l -2 y"), int(2));
    assert_eq!(key.run("LRANGE l 0 -1"), bulks(&["y", "b"]));
    assert_eq!(key.run("LTRIM l 5 9"), Data::ok());
    // The last element gone, the key is gone (as in Redis).
    assert_eq!(key.value, None);
    assert_eq!(key.run("LPOP l 1"), Data::NilArray);
}

#[test]
fn sets_add_remove_and_pop_deterministically() {
    let mut key = Key::new();
    assert_eq!(key.run("SADD s a b c a"), int(3));
    assert_eq!(key.run("SMEMBERS s"), bulks(&["a", "b", "c"]));
    assert_eq!(key.run("SMISMEMBER s a x"), Data::Array(vec![int(1), int(0)]));
    assert_eq!(key.run("SREM s a x"), int(1));
    let mut twin = Key { value: key.value.clone(), now_ms: key.now_ms };
    // Every replica applying the same SPOP removes the same member.
    assert_eq!(key.run("SPOP s"), twin.run("SPOP s"));
    assert_eq!(key.value, twin.value);
    assert_eq!(key.run("SCARD s"), int(1));
}

#[test]
fn sorted_sets_order_by_score_then_member() {
    let mut key = Key::new();
    assert_eq!(key.run("ZADD z 2 b 1 a 2 a2 3 c"), int(4));
    assert_eq!(key.run("ZRANGE z 0 -1"), bulks(&["a", "a2", "b", "c"]));
    assert_eq!(key.run("ZRANGE z (1 2 BYSCORE WITHSCORES"), bulks(&["a2", "2", "b", "2"]));
    assert_eq!(key.run("ZRANGE z +inf -inf BYSCORE REV LIMIT 0 1"), bulks(&["c"]));
    assert_eq!(key.run("ZADD z XX CH 5 a 9 nope"), int(1));
    assert_eq!(key.run("ZADD z GT 1 a"), int(0));
    assert_eq!(key.run("ZSCORE z a"), Data::bulk("5"));
    assert_eq!(key.run("ZINCRBY z 0.5 a"), Data::bulk("5.5"));
    assert_eq!(key.run("ZRANK z a"), int(3));
    assert_eq!(key.run("ZREVRANK z a"), int(0));
    assert_eq!(key.run("ZCOUNT z -inf (3"), int(2));
    assert_eq!(key.run("ZPOPMIN z"), bulks(&["a2", "2"]));
    assert_eq!(key.run("ZREMRANGEBYSCORE z 3 +inf"), int(2));
    assert_eq!(key.run("ZRANGE z 0 -1"), bulks(&["b"]));
    assert_eq!(key.run("ZADD z NX XX 1 a"), err("ERR XX and NX options at the same time are not compatible"));
}

#[test]
fn hashes_increment_and_refuse_non_numbers() {
    let mut key = Key::new();
    assert_eq!(key.run("HSET h f 1 g x"), int(2));
    assert_eq!(key.run("HINCRBY h f 41"), int(42));
    assert_eq!(key.run("HINCRBY h g 1"), err("ERR hash value is not an integer"));
    assert_eq!(key.run("HINCRBYFLOAT h n 1.5"), Data::bulk("1.5"));
    assert_eq!(key.run("HSETNX h f 0"), int(0));
    assert_eq!(key.run("HLEN h"), int(3));
    assert_eq!(key.run("HKEYS h"), bulks(&["f", "g", "n"]));
}

#[test]
fn wrong_type_is_refused_as_redis_words_it_and_changes_nothing() {
    let mut key = Key::new();
    key.run("RPUSH k a");
    let before = key.value.clone();
    for line in ["SADD k x", "ZADD k 1 x", "HSET k f v", "GET k", "INCR k", "APPEND k x", "ZSCORE k x"] {
        assert_eq!(key.run(line), err(WRONGTYPE), "{line}");
        assert_eq!(key.value, before, "{line}");
    }
    assert_eq!(key.run("TYPE k"), Data::Status("list".into()));
    // SET replaces any type.
    assert_eq!(key.run("SET k v"), Data::ok());
    assert_eq!(key.run("TYPE k"), Data::Status("string".into()));
}

#[test]
fn strings_ranges_floats_and_bits() {
    let mut key = Key::new();
    assert_eq!(key.run("APPEND s hello"), int(5));
    assert_eq!(key.run("SETRANGE s 6 world"), int(11));
    assert_eq!(key.run("GETRANGE s -5 -1"), Data::bulk("world"));
    assert_eq!(key.run("STRLEN s"), int(11));
    let mut n = Key::new();
    assert_eq!(n.run("INCRBYFLOAT n 10.5"), Data::bulk("10.5"));
    assert_eq!(n.run("INCRBYFLOAT n -0.5"), Data::bulk("10"));
    let mut bits = Key::new();
    assert_eq!(bits.run("SETBIT b 7 1"), int(0));
    assert_eq!(bits.run("GETBIT b 7"), int(1));
    assert_eq!(bits.run("BITCOUNT b"), int(1));
    assert_eq!(bits.run("BITPOS b 1"), int(7));
}

#[test]
fn a_deadline_travels_with_the_value_and_is_judged_by_the_ops_clock() {
    let mut key = Key::new();
    assert_eq!(key.run("SET k v PX 100"), Data::ok());
    assert_eq!(key.run("PTTL k"), int(100));
    key.now_ms += 99;
    assert_eq!(key.run("GET k"), Data::bulk("v"));
    key.now_ms += 1;
    // At the deadline the key is gone, for reads and writes alike, and the op deletes it.
    assert_eq!(key.run("GET k"), Data::Nil);
    assert_eq!(key.value, None);
    assert_eq!(key.run("TTL k"), int(-2));
}

#[test]
fn expire_options_follow_redis() {
    let mut key = Key::new();
    assert_eq!(key.run("EXPIRE k 10"), int(0));
    key.run("SET k v");
    assert_eq!(key.run("TTL k"), int(-1));
    assert_eq!(key.run("EXPIRE k 10 XX"), int(0));
    assert_eq!(key.run("EXPIRE k 10 NX"), int(1));
    assert_eq!(key.run("EXPIRE k 5 GT"), int(0));
    assert_eq!(key.run("EXPIRE k 20 GT"), int(1));
    assert_eq!(key.run("EXPIRE k 30 LT"), int(0));
    assert_eq!(key.run("PEXPIRETIME k"), int(1_000_000 + 20_000));
    assert_eq!(key.run("PERSIST k"), int(1));
    assert_eq!(key.run("PERSIST k"), int(0));
    assert_eq!(key.run("SET k w KEEPTTL"), Data::ok());
    assert_eq!(key.run("GETEX k EX 1"), Data::bulk("w"));
    assert_eq!(key.run("TTL k"), int(1));
    assert_eq!(key.run("SET k x"), Data::ok());
    assert_eq!(key.run("TTL k"), int(-1), "a plain SET forgets the deadline");
    assert_eq!(key.run("EXPIRE k -1"), int(1));
    assert_eq!(key.value, None, "a deadline in the past deletes");
    assert_eq!(key.run("SET k v EX 0"), err("ERR invalid expire time in 'set' command"));
}

#[test]
fn a_failed_command_still_deletes_the_expired_key_it_found() {
    let mut key = Key::new();
    key.run("SET k v PX 5");
    key.now_ms += 5;
    assert_eq!(key.run("LPOS k x RANK 0").clone(), err("ERR RANK can't be zero: use 1 to start from the first match, 2 from the second ... or use negative to start from the end of the list"));
    assert_eq!(key.value, None);
}

#[test]
fn a_value_over_the_limit_is_refused_and_nothing_changes() {
    let mut key = Key::new();
    let op = |args: &str| ExecOp { now_ms: 0, bytes_max: 64, args: args.split(' ').map(b).collect() };
    let effect = apply(
        &op("RPUSH l 0123456789012345678901234567890123456789 0123456789012345678901234567890123456789"),
        None,
    );
    assert_eq!(effect.write, None);
    assert!(matches!(effect.outcome, Outcome::Data(Data::Error(line)) if line.contains("size limit")));
    assert_eq!(key.run("RPUSH l a"), int(1));
}

#[test]
fn the_bytes_bound_covers_what_every_command_writes() {
    let mut key = Key::new();
    for line in [
        "RPUSH k a bb ccc",
        "LINSERT k AFTER a zz",
        "LSET k 0 qqqqqq",
        "EXPIRE k 100",
        "SET s 1",
        "INCRBYFLOAT s 0.1",
        "INCRBYFLOAT s 0.2",
        "SETRANGE s 300 x",
        "SETBIT s 9000 1",
        "BITFIELD s SET u8 20000 1 GET u8 0 INCRBY i5 #9000 3",
        "PFADD p a b c",
        "ZADD z 1 a 2 b",
        "ZINCRBY z 0.1 a",
        "HSET h f 1",
        "HINCRBYFLOAT h f 0.1",
        "SADD t x y",
    ] {
        let args: Vec<Bytes> = line.split(' ').map(b).collect();
        let name = args[1].clone();
        let op = ExecOp { now_ms: key.now_ms, bytes_max: u32::MAX, args };
        let current = if name == "k" { key.value.clone() } else { None };
        let before = current.as_ref().map_or(0, |v| v.len());
        let effect = apply(&op, current.as_ref());
        let after = effect.write.clone().flatten().map_or(before, |v| v.len());
        assert!(after <= bytes_bound(&op, before), "{line}: {after} > {}", bytes_bound(&op, before));
        if name == "k" {
            if let Some(write) = effect.write {
                key.value = write;
            }
        }
    }
}

#[test]
fn glob_patterns_match_as_redis() {
    assert!(glob_match(b"h?llo", b"hello"));
    assert!(glob_match(b"h*llo", b"heeeello"));
    assert!(glob_match(b"h[ae]llo", b"hallo"));
    assert!(!glob_match(b"h[^e]llo", b"hello"));
    assert!(glob_match(b"h[a-b]llo", b"hbllo"));
    assert!(glob_match(b"*", b""));
    assert!(!glob_match(b"a*b", b"ac"));
}

#[test]
fn doubles_print_as_redis_prints_them() {
    assert_eq!(format_double(1.5), "1.5");
    assert_eq!(format_double(3.0), "3");
    assert_eq!(format_double(f64::INFINITY), "inf");
    assert_eq!(format_double(0.1 + 0.2), "0.30000000000000004");
    assert!(parse_float(b"nan").is_err());
    assert_eq!(parse_float(b"-inf"), Ok(f64::NEG_INFINITY));
}

#[test]
fn geo_positions_hashes_and_distances_match_redis() {
    let mut key = Key::new();
    assert_eq!(
        key.run("GEOADD g 2.1909389952632 41.433791470673 p1 2.1873744593677 41.406342043777 p2"),
        int(2)
    );
    // Redis 7's answers for the same commands (redis-py's tests/test_commands.py).
    assert_eq!(
        key.run("GEOHASH g p1 p2 p3"),
        Data::Array(vec![Data::bulk("sp3e9yg3kd0"), Data::bulk("sp3e9cbc3t0"), Data::Nil])
    );
    assert_eq!(key.run("GEODIST g p1 p2 km"), Data::bulk("3.0674"));
    let Data::Array(positions) = key.run("GEOPOS g p1 nope") else { panic!("GEOPOS answers an array") };
    assert_eq!(
        positions[0],
        Data::Array(vec![
            Data::double("2.19093829393386841".parse().unwrap()),
            Data::double("41.43379028184083523".parse().unwrap())
        ])
    );
    assert_eq!(positions[1], Data::NilArray);
    assert_eq!(
        key.run("GEOSEARCH g FROMLONLAT 2.191 41.433 BYRADIUS 1 km WITHDIST WITHHASH"),
        Data::Array(vec![Data::Array(vec![Data::bulk("p1"), Data::bulk("0.0881"), int(3471609698139488)])])
    );
    assert_eq!(key.run("GEORADIUS g 2.191 41.433 3000 m DESC"), bulks(&["p2", "p1"]));
    assert_eq!(key.run("GEORADIUS g 2.191 41.433 3000 m COUNT 1 ANY"), bulks(&["p2"]));
    assert_eq!(key.run("GEOADD g 181 0 bad"), err("ERR invalid longitude,latitude pair 181.000000,0.000000"));
    assert_eq!(key.run("TYPE g"), Data::Status("zset".into()));
}

#[test]
fn streams_add_read_trim_and_track_pending_entries() {
    let mut key = Key::new();
    assert_eq!(key.run("XADD s 5-1 f a"), Data::bulk("5-1"));
    // An automatic ID never goes below the last one, whatever the clock says.
    key.now_ms = 3;
    assert_eq!(key.run("XADD s * f b"), Data::bulk("5-2"));
    key.now_ms = 7;
    assert_eq!(key.run("XADD s 7-* f c"), Data::bulk("7-0"));
    assert_eq!(
        key.run("XADD s 6-0 f d"),
        err("ERR The ID specified in XADD is equal or smaller than the target stream top item")
    );
    assert_eq!(key.run("XLEN s"), int(3));
    assert_eq!(key.run("XGROUP CREATE s g 0"), Data::ok());
    let delivered = key.run("XREADGROUP GROUP g c COUNT 2 STREAMS s >");
    assert!(format!("{delivered:?}").contains("5-2") && !format!("{delivered:?}").contains("7-0"));
    assert_eq!(key.run("XACK s g 5-1 9-9"), int(1));
    // Approximate trimming removes whole nodes only: the one node goes when MAXLEN is 0.
    assert_eq!(key.run("XTRIM s MAXLEN ~ 1"), int(0));
    assert_eq!(key.run("XTRIM s MAXLEN ~ 0"), int(3));
    assert_eq!(key.run("XLEN s"), int(0));
    // The still pending entry was deleted: its history answers it without fields.
    let history = key.run("XREADGROUP GROUP g c STREAMS s 0");
    assert_eq!(history, Data::Array(vec![Data::Array(vec![Data::bulk("5-2"), Data::NilArray])]));
    // An empty stream stays, with its last ID.
    assert_eq!(
        key.run("XADD s 7-0 f e"),
        err("ERR The ID specified in XADD is equal or smaller than the target stream top item")
    );
}

#[test]
fn bitfield_reads_and_writes_fields_as_redis_7() {
    let mut key = Key::new();
    let ints = |values: &[i64]| Data::Array(values.iter().map(|value| int(*value)).collect());
    // Each expected reply is what Redis 7.0.15 answered to the same commands.
    assert_eq!(
        key.run("BITFIELD bf SET u8 8 255 GET u8 0 GET u4 8 GET u4 12 GET u4 13"),
        ints(&[0, 0, 15, 15, 14])
    );
    assert_eq!(
        key.run("BITFIELD bf SET i8 0 -100 INCRBY i8 0 -100 OVERFLOW SAT INCRBY i8 0 -100 OVERFLOW FAIL INCRBY i8 0 -1"),
        ints(&[0, 56, -44, -45])
    );
    assert_eq!(
        key.run("BITFIELD bf SET u8 #1 -1 GET u8 #1 OVERFLOW SAT SET u8 #1 -5 GET u8 #1 OVERFLOW WRAP SET u4 0 100 GET u4 0"),
        ints(&[255, 255, 255, 255, 13, 4])
    );
    let max = i64::MAX.to_string();
    let wrapped = key.run(&format!(
        "BITFIELD bf SET i64 0 {max} INCRBY i64 0 1 OVERFLOW SAT INCRBY i64 0 1 INCRBY i64 0 -2"
    ));
    assert_eq!(wrapped, ints(&[4899634919602388992, i64::MIN, i64::MIN + 1, i64::MIN]));
    assert_eq!(key.run("BITFIELD bf OVERFLOW FAIL INCRBY u2 0 5"), Data::Array(vec![Data::Nil]));
    assert_eq!(key.run("BITFIELD_RO bf GET u8 0 OVERFLOW SAT"), ints(&[128]));
    assert_eq!(key.run("BITFIELD bf"), ints(&[]));
    for (line, error) in [
        ("BITFIELD bf GET u64 0", "ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is."),
        ("BITFIELD bf GET i65 0", "ERR Invalid bitfield type. Use something like i16 u8. Note that u64 is not supported but i64 is."),
        ("BITFIELD bf GET u8 -1", "ERR bit offset is not an integer or out of range"),
        ("BITFIELD bf GET u8 #-1", "ERR bit offset is not an integer or out of range"),
        ("BITFIELD bf OVERFLOW FOO", "ERR Invalid OVERFLOW type specified"),
        ("BITFIELD bf FOO", "ERR syntax error"),
        ("BITFIELD bf SET u8 0 x", "ERR value is not an integer or out of range"),
        ("BITFIELD_RO bf SET u8 0 1", "ERR BITFIELD_RO only supports the GET subcommand"),
    ] {
        assert_eq!(key.run(line), err(error), "{line}");
    }
}

#[test]
fn bitfield_on_a_missing_key_reads_zeros_and_a_failed_write_still_creates_it() {
    let mut key = Key::new();
    assert_eq!(key.run("BITFIELD k GET u8 0"), Data::Array(vec![int(0)]));
    assert_eq!(key.run("EXISTS k"), int(0));
    assert_eq!(key.run("BITFIELD k OVERFLOW FAIL INCRBY u2 100 5"), Data::Array(vec![Data::Nil]));
    assert_eq!(key.run("STRLEN k"), int(13), "as Redis: grown to hold the field");
}

#[test]
fn xsetid_moves_the_last_id_with_redis_7_checks() {
    let mut key = Key::new();
    assert_eq!(key.run("XSETID s 1-1"), err("ERR no such key"));
    key.run("XADD s 5-1 f v");
    assert_eq!(
        key.run("XSETID s 4-0"),
        err("ERR The ID specified in XSETID is smaller than the target stream top item")
    );
    assert_eq!(
        key.run("XSETID s 6-0 ENTRIESADDED 0"),
        err("ERR The entries_added specified in XSETID is smaller than the target stream length")
    );
    assert_eq!(key.run("XSETID s 6-0 ENTRIESADDED -1"), err("ERR entries_added must be positive"));
    assert_eq!(
        key.run("XSETID s 6-0 MAXDELETEDID 7-0"),
        err("ERR The ID specified in XSETID is smaller than the provided max_deleted_entry_id")
    );
    assert_eq!(key.run("XSETID s -"), err("ERR Invalid stream ID specified as stream command argument"));
    assert_eq!(key.run("XSETID s 6-0 FOO 1"), err("ERR syntax error"));
    assert_eq!(key.run("XSETID s 6-0 MAXDELETEDID 3-0 ENTRIESADDED 5"), Data::ok());
    key.now_ms = 1;
    assert_eq!(key.run("XADD s * f w"), Data::bulk("6-1"), "automatic IDs grow from the new last ID");
    key.run("SET str x");
    assert!(matches!(key.run("XSETID str 1-1"), Data::Error(e) if e.starts_with("WRONGTYPE")));
}

#[test]
fn exact_trimming_removes_entries_one_by_one() {
    let mut key = Key::new();
    for seq in 1..=5 {
        key.run(&format!("XADD s 1-{seq} f v"));
    }
    assert_eq!(key.run("XTRIM s MAXLEN 2"), int(3));
    assert_eq!(key.run("XTRIM s MINID 1-5"), int(1));
    assert_eq!(
        key.run("XRANGE s - +"),
        Data::Array(vec![Data::Array(vec![Data::bulk("1-5"), bulks(&["f", "v"])])])
    );
}

fn batch(guard: Option<Option<Bytes>>, commands: &[&str]) -> Vec<Bytes> {
    let batch = Batch {
        key: b("k"),
        guard,
        commands: commands.iter().map(|line| line.split(' ').map(b).collect()).collect(),
    };
    assert_eq!(Batch::parse(&batch.args()).as_ref(), Some(&batch));
    batch.args()
}

#[test]
fn a_transaction_on_one_key_runs_its_commands_in_one_rmw() {
    let mut key = Key::new();
    let replies = key.run_args(batch(None, &["SET k 1", "INCR k", "LPUSH k x", "GET k"]));
    let wrong = "WRONGTYPE Operation against a key holding the wrong kind of value";
    assert_eq!(replies, Data::Array(vec![Data::ok(), int(2), err(wrong), Data::bulk("2")]));
    assert_eq!(key.run("GET k"), Data::bulk("2"));
}

#[test]
fn a_watched_transaction_runs_only_if_the_key_is_unchanged() {
    let mut key = Key::new();
    key.run("SET k 5 PX 100");
    let watched = key.value.clone();
    // The value WATCH read: it runs.
    assert_eq!(key.run_args(batch(Some(watched.clone()), &["INCR k"])), Data::Array(vec![int(6)]));
    // Changed since: aborted (nil), nothing written.
    assert_eq!(key.run_args(batch(Some(watched.clone()), &["SET k 0"])), Data::NilArray);
    assert_eq!(key.run("GET k"), Data::bulk("6"));
    // Expired since, though its bytes are the same: aborted, and the key is gone.
    let watched = key.value.clone();
    key.now_ms += 100;
    assert_eq!(key.run_args(batch(Some(watched.clone()), &["SET k 0"])), Data::NilArray);
    assert_eq!(key.value, None);
    assert_eq!(key.run_args(batch(Some(None), &["SET k 1"])), Data::Array(vec![Data::ok()]));
}

/// DUMP `from` at one key, RESTORE the payload (with `options`) at a fresh key.
fn dump_and_restore(from: &mut Key, options: &str) -> (Key, Data) {
    let Data::Bulk(payload) = from.run("DUMP k") else { panic!("DUMP answered no payload") };
    let mut to = Key::new();
    let mut args: Vec<Bytes> = "RESTORE k".split(' ').map(b).collect();
    args.extend(options.split(' ').map(b));
    args.insert(3, payload);
    let reply = to.run_args(args);
    (to, reply)
}

#[test]
fn dump_and_restore_carry_every_type() {
    let writes = [
        "SET k text",
        "HSET k f v g w",
        "RPUSH k a b a",
        "SADD k x y",
        "ZADD k 1.5 m -inf n",
        "XADD k 1-1 field value",
    ];
    for write in writes {
        let mut from = Key::new();
        from.run(write);
        let (to, reply) = dump_and_restore(&mut from, "0");
        assert_eq!(reply, Data::ok(), "{write}");
        assert_eq!(to.value, from.value, "{write}: the restored key holds the same value");
    }
    assert_eq!(Key::new().run("DUMP k"), Data::Nil);
}

#[test]
fn restore_follows_redis_options_and_ttls() {
    let mut from = Key::new();
    from.run("SET k v");
    let (mut to, reply) = dump_and_restore(&mut from, "5000");
    assert_eq!(reply, Data::ok());
    assert_eq!(to.run("PTTL k"), int(5000), "a relative TTL counts from the op's clock");
    let Data::Bulk(payload) = from.run("DUMP k") else { unreachable!() };
    let restore = |key: &mut Key, rest: &str| {
        let mut args = vec![b("RESTORE"), b("k"), b(rest.split(' ').next().unwrap()), payload.clone()];
        args.extend(rest.split(' ').skip(1).map(b));
        key.run_args(args)
    };
    assert_eq!(restore(&mut to, "0"), err("BUSYKEY Target key name already exists."));
    assert_eq!(restore(&mut to, "0 REPLACE"), Data::ok());
    assert_eq!(to.run("TTL k"), int(-1));
    assert_eq!(restore(&mut to, "2000000 REPLACE ABSTTL IDLETIME 10"), Data::ok());
    assert_eq!(to.run("PEXPIRETIME k"), int(2_000_000));
    assert_eq!(restore(&mut to, "-1 REPLACE"), err("ERR Invalid TTL value, must be >= 0"));
    assert_eq!(
        restore(&mut to, "0 REPLACE FREQ 256"),
        err("ERR Invalid FREQ value, must be >= 0 and <= 255")
    );
    assert_eq!(restore(&mut to, "0 REPLACE IDLETIME -1"), err("ERR Invalid IDLETIME value, must be >= 0"));
    assert_eq!(restore(&mut to, "0 REPLACE IDLETIME 1 FREQ 1"), err("ERR syntax error"));
    assert_eq!(to.run("PEXPIRETIME k"), int(2_000_000), "a refused RESTORE changed nothing");
    // An absolute deadline already passed: the key is deleted, as Redis does.
    assert_eq!(restore(&mut to, "999 REPLACE ABSTTL"), Data::ok());
    assert_eq!(to.value, None);
}

#[test]
fn a_corrupted_or_foreign_payload_is_refused_and_changes_nothing() {
    let mut from = Key::new();
    from.run("RPUSH k a b c");
    let Data::Bulk(payload) = from.run("DUMP k") else { unreachable!() };
    let mut to = Key::new();
    to.run("SET k old");
    let wrong = err("ERR DUMP payload version or checksum are wrong");
    let restore = |to: &mut Key, bad: Vec<u8>| {
        to.run_args(vec![b("RESTORE"), b("k"), b("0"), Bytes::from(bad), b("REPLACE")])
    };
    for at in 0..payload.len() {
        let mut bad = payload.to_vec();
        bad[at] ^= 0x01;
        assert_eq!(restore(&mut to, bad), wrong, "a flipped bit at byte {at}");
    }
    assert_eq!(restore(&mut to, payload[..payload.len() - 1].to_vec()), wrong, "truncated");
    assert_eq!(restore(&mut to, Vec::new()), wrong, "empty");
    // A payload in Redis' layout (RDB type 0, the string "v", RDB version 10, a CRC-64).
    let redis = b"\x00\x01v\x0a\x00\x9c\x8f\xf4\x97\x5f\xbb\x47\x4b".to_vec();
    assert_eq!(restore(&mut to, redis), wrong, "Redis' RDB payloads are not Chorus'");
    assert_eq!(to.value, Some(b("old")), "nothing changed");
}

#[test]
fn a_payload_with_a_good_checksum_but_a_malformed_body_is_refused() {
    let seal = |body: &[u8]| {
        let mut raw = body.to_vec();
        raw.extend_from_slice(b"chorus\x01\x00");
        let checksum = crc32fast::hash(&raw);
        raw.extend_from_slice(&checksum.to_le_bytes());
        Bytes::from(raw)
    };
    let unsorted_hash = crate::hash::encode(&vec![(b("b"), b("1")), (b("a"), b("2"))]).unwrap();
    let with_deadline = value::encode(&Entry { value: Typed::String(b("v")), deadline_ms: Some(5) }).unwrap();
    let bad_list = [value::LIST_MAGIC, b"\x09\x00\x00\x00"].concat();
    for body in [&unsorted_hash[..], &with_deadline[..], &bad_list[..]] {
        assert_eq!(dump::decode_payload(&seal(body)), Err(dump::PayloadError::BadFormat), "{body:?}");
    }
    assert_eq!(dump::decode_payload(&seal(b"plain")), Ok(Typed::String(b("plain"))));
}

proptest::proptest! {
    #[test]
    fn arbitrary_payloads_never_panic(
        junk in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..96),
        sealed in proptest::prelude::any::<bool>(),
    ) {
        // Sealed: a valid trailer and checksum around junk, so the body decoder sees it.
        let mut payload = junk;
        if sealed {
            payload.extend_from_slice(b"chorus\x01\x00");
            let checksum = crc32fast::hash(&payload);
            payload.extend_from_slice(&checksum.to_le_bytes());
        }
        let mut key = Key::new();
        let _ = key.run_args(vec![b("RESTORE"), b("k"), b("0"), Bytes::from(payload)]);
    }
}
