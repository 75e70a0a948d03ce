//! Redis' data types, expiry and multi-key commands through the real binary on every
//! protocol, with a real client (the `redis` crate): written at one replica, read at another
//! (issue 19, points 1-3).

use redis::Value;
use support::loopback::Cluster;
use support::{error_of, query};

mod support;

const PROTOCOLS: [&str; 5] = ["hermes", "craq", "zab", "raftlog", "chain"];

#[test]
fn typed_values_written_at_one_replica_are_read_at_another_on_every_protocol() {
    for protocol in PROTOCOLS {
        let cluster = Cluster::start(3, &["--protocol", protocol]);
        let (mut a, mut b) = (cluster.client(0), cluster.client(1));
        let p = protocol;

        assert_eq!(query::<i64>(&mut a, "RPUSH queue j1 j2 j3"), 3, "{p}");
        assert_eq!(query::<Vec<String>>(&mut b, "LRANGE queue 0 -1"), ["j1", "j2", "j3"], "{p}");
        assert_eq!(query::<Option<String>>(&mut b, "LPOP queue"), Some("j1".into()), "{p}");
        assert_eq!(query::<i64>(&mut a, "LLEN queue"), 2, "{p}");

        assert_eq!(query::<i64>(&mut a, "SADD tags x y z x"), 3, "{p}");
        assert_eq!(query::<i64>(&mut b, "SISMEMBER tags y"), 1, "{p}");
        assert_eq!(query::<i64>(&mut b, "SREM tags y"), 1, "{p}");
        assert_eq!(query::<Vec<String>>(&mut a, "SMEMBERS tags"), ["x", "z"], "{p}");

        assert_eq!(query::<i64>(&mut a, "ZADD board 10 ann 20 bob 15 cy"), 3, "{p}");
        assert_eq!(query::<Vec<String>>(&mut b, "ZREVRANGE board 0 1"), ["bob", "cy"], "{p}");
        assert_eq!(query::<String>(&mut b, "ZINCRBY board 11 ann"), "21", "{p}");
        assert_eq!(query::<Option<i64>>(&mut a, "ZRANK board ann"), Some(2), "{p}");

        assert_eq!(query::<i64>(&mut a, "HSET user name ann visits 1"), 2, "{p}");
        assert_eq!(query::<i64>(&mut b, "HINCRBY user visits 4"), 5, "{p}");
        assert_eq!(query::<i64>(&mut a, "HLEN user"), 2, "{p}");

        assert_eq!(query::<i64>(&mut a, "GEOADD places 2.1909389952632 41.433791470673 p1"), 1, "{p}");
        query::<i64>(&mut a, "GEOADD places 2.1873744593677 41.406342043777 p2");
        assert_eq!(query::<String>(&mut b, "GEODIST places p1 p2 km"), "3.0674", "{p}");
        assert_eq!(query::<Vec<String>>(&mut b, "GEOHASH places p1"), ["sp3e9yg3kd0"], "{p}");

        // Streams: explicit IDs (auto IDs come from the coordinator's clock), a consumer
        // group whose pending entries follow the stream to another replica.
        assert_eq!(query::<String>(&mut a, "XADD events 1-1 kind signup"), "1-1", "{p}");
        assert_eq!(query::<String>(&mut b, "XADD events 1-2 kind login"), "1-2", "{p}");
        assert!(error_of(&mut a, "XADD events 1-1 kind late").contains("equal or smaller"), "{p}");
        assert_eq!(query::<i64>(&mut a, "XLEN events"), 2, "{p}");
        assert_eq!(query::<String>(&mut a, "XGROUP CREATE events workers 0"), "OK", "{p}");
        let read: Value = query(&mut b, "XREADGROUP GROUP workers w1 COUNT 1 STREAMS events >");
        assert!(format!("{read:?}").contains("signup"), "{p}: {read:?}");
        assert_eq!(query::<i64>(&mut a, "XACK events workers 1-1"), 1, "{p}");
        assert_eq!(query::<i64>(&mut a, "XTRIM events MAXLEN ~ 0"), 2, "{p}");
        assert_eq!(query::<String>(&mut b, "TYPE events"), "stream", "{p}");

        // BITFIELD and HyperLogLog: strings in Redis' own layouts, counted as Redis counts.
        let fields: Vec<i64> = query(&mut a, "BITFIELD bits SET u8 8 255 GET u8 0 INCRBY u4 8 1");
        assert_eq!(fields, [0, 0, 0], "{p}: u4 at 8 was 15 and wraps to 0");
        assert_eq!(query::<Vec<i64>>(&mut b, "BITFIELD_RO bits GET u16 0"), [0x0f], "{p}");
        assert_eq!(query::<i64>(&mut a, "PFADD visitors 1 2 3"), 1, "{p}");
        assert_eq!(query::<i64>(&mut b, "PFADD visitors 3"), 0, "{p}");
        assert_eq!(query::<i64>(&mut b, "PFADD {visitors}2 3 4"), 1, "{p}");
        assert_eq!(query::<i64>(&mut a, "PFCOUNT visitors {visitors}2"), 4, "{p}");
        query::<()>(&mut b, "PFMERGE visitors {visitors}2");
        assert_eq!(query::<i64>(&mut a, "PFCOUNT visitors"), 4, "{p}");
        query::<()>(&mut a, "SET plain x");
        assert!(error_of(&mut b, "PFADD plain y").contains("not a valid HyperLogLog"), "{p}");

        // LCS of two strings written at different replicas, as Redis answers it.
        query::<()>(&mut a, "SET lcs:a ohmytext");
        query::<()>(&mut b, "SET lcs:b mynewtext");
        assert_eq!(query::<String>(&mut a, "LCS lcs:a lcs:b"), "mytext", "{p}");
        type Idx = (String, Vec<((i64, i64), (i64, i64), i64)>, String, i64);
        let (matches, runs, len, length): Idx =
            query(&mut b, "LCS lcs:a lcs:b IDX MINMATCHLEN 3 WITHMATCHLEN");
        assert_eq!(
            (matches.as_str(), runs, len.as_str(), length),
            ("matches", vec![((4, 7), (5, 8), 4)], "len", 6)
        );

        // WRONGTYPE as Redis words it, and nothing changes.
        let wrong = error_of(&mut b, "SADD queue x");
        assert!(
            wrong.contains("WRONGTYPE")
                && wrong.contains("Operation against a key holding the wrong kind of value"),
            "{p}: {wrong}"
        );
        assert!(error_of(&mut a, "GET board").contains("WRONGTYPE"), "{p}");
        assert_eq!(query::<String>(&mut a, "TYPE board"), "zset", "{p}");

        // Multi-key commands, per key.
        assert_eq!(query::<i64>(&mut a, "SADD more z w"), 2, "{p}");
        assert_eq!(query::<i64>(&mut b, "SINTERSTORE both tags more"), 1, "{p}");
        assert_eq!(query::<Vec<String>>(&mut a, "SMEMBERS both"), ["z"], "{p}");
        assert_eq!(query::<i64>(&mut a, "ZUNIONSTORE sum 2 board board WEIGHTS 1 2"), 3, "{p}");
        assert_eq!(query::<Option<String>>(&mut b, "ZSCORE sum ann"), Some("63".into()), "{p}");
        assert_eq!(query::<Option<String>>(&mut a, "RPOPLPUSH queue done"), Some("j3".into()), "{p}");
        assert_eq!(query::<Vec<String>>(&mut b, "LRANGE done 0 -1"), ["j3"], "{p}");

        // DEL removes typed values too; the last element gone, the key is gone.
        assert_eq!(query::<i64>(&mut b, "DEL queue tags board"), 3, "{p}");
        assert_eq!(query::<i64>(&mut a, "EXISTS queue tags board user"), 1, "{p}");
        assert_eq!(query::<Option<String>>(&mut a, "LPOP done"), Some("j3".into()), "{p}");
        assert_eq!(query::<i64>(&mut b, "EXISTS done"), 0, "{p}");
    }
}

#[test]
fn a_deadline_set_at_one_replica_holds_at_every_replica() {
    for protocol in PROTOCOLS {
        let cluster = Cluster::start(3, &["--protocol", protocol]);
        let (mut a, mut b, mut c) = (cluster.client(0), cluster.client(1), cluster.client(2));
        let p = protocol;

        assert_eq!(query::<String>(&mut a, "SET session s1 EX 1000"), "OK", "{p}");
        let ttl: i64 = query(&mut b, "TTL session");
        assert!((999..=1000).contains(&ttl), "{p}: TTL {ttl}");
        assert_eq!(query::<Option<String>>(&mut c, "GET session"), Some("s1".into()), "{p}");
        assert_eq!(query::<i64>(&mut c, "PERSIST session"), 1, "{p}");
        assert_eq!(query::<i64>(&mut b, "TTL session"), -1, "{p}");

        // A deadline in the past: every replica sees the key gone, now and later.
        assert_eq!(query::<i64>(&mut b, "PEXPIREAT session 1000"), 1, "{p}");
        for con in [&mut a, &mut b, &mut c] {
            assert_eq!(query::<Option<String>>(con, "GET session"), None, "{p}");
            assert_eq!(query::<i64>(con, "TTL session"), -2, "{p}");
        }

        // Typed values keep their deadline through updates; a plain SET forgets it.
        query::<i64>(&mut a, "RPUSH jobs a");
        assert_eq!(query::<i64>(&mut b, "EXPIRE jobs 500 NX"), 1, "{p}");
        assert_eq!(query::<i64>(&mut c, "RPUSH jobs b"), 2, "{p}");
        assert!(query::<i64>(&mut a, "TTL jobs") > 0, "{p}");
        assert_eq!(query::<i64>(&mut b, "EXPIRE jobs 100 GT"), 0, "{p}");
        assert_eq!(query::<String>(&mut a, "SET lock owner NX PX 60000"), "OK", "{p}");
        assert_eq!(
            query::<Option<String>>(&mut b, "SET lock other NX PX 60000"),
            None,
            "{p}: the lock is held"
        );
        assert_eq!(query::<Option<String>>(&mut c, "GETDEL lock"), Some("owner".into()), "{p}");
        assert_eq!(query::<Option<String>>(&mut a, "GETEX lock"), None, "{p}");
        assert_eq!(query::<String>(&mut a, "SETEX cache 100 v"), "OK", "{p}");
        assert_eq!(query::<String>(&mut b, "SET cache w"), "OK", "{p}");
        assert_eq!(query::<i64>(&mut c, "TTL cache"), -1, "{p}");
        let invalid = error_of(&mut a, "SET cache v EX 0");
        assert!(invalid.contains("invalid expire time in 'set' command"), "{p}: {invalid}");
    }
}

/// DUMP at one replica, RESTORE the payload at another, read the copy at a third: RESTORE is
/// a replicated write on every protocol. A corrupted payload is refused and changes nothing.
#[test]
fn a_dumped_key_of_each_type_restores_at_another_replica_on_every_protocol() {
    let writes = [
        ("string", "SET src:string text", "GET"),
        ("hash", "HSET src:hash f v g w", "HGETALL"),
        ("list", "RPUSH src:list a b a", "LRANGE"),
        ("set", "SADD src:set x y", "SMEMBERS"),
        ("zset", "ZADD src:zset 1.5 m 2 n", "ZRANGE"),
        ("stream", "XADD src:stream 1-1 field value", "XRANGE"),
    ];
    let read = |con: &mut redis::Connection, how: &str, key: &str| -> Value {
        let line = match how {
            "LRANGE" | "ZRANGE" => format!("{how} {key} 0 -1"),
            "XRANGE" => format!("{how} {key} - +"),
            _ => format!("{how} {key}"),
        };
        query(con, &line)
    };
    for protocol in PROTOCOLS {
        let cluster = Cluster::start(3, &["--protocol", protocol]);
        let (mut a, mut b, mut c) = (cluster.client(0), cluster.client(1), cluster.client(2));
        let p = protocol;
        for (kind, write, how) in writes {
            let _: Value = query(&mut a, write);
            let payload: Vec<u8> = query(&mut b, &format!("DUMP src:{kind}"));
            let restored: String = redis::cmd("RESTORE")
                .arg(format!("copy:{kind}"))
                .arg(60_000)
                .arg(&payload)
                .query(&mut c)
                .unwrap();
            assert_eq!(restored, "OK", "{p} {kind}");
            assert_eq!(query::<String>(&mut a, &format!("TYPE copy:{kind}")), kind, "{p}");
            let (original, copy) =
                (read(&mut b, how, &format!("src:{kind}")), read(&mut a, how, &format!("copy:{kind}")));
            assert_eq!(copy, original, "{p} {kind}: the copy read at another replica");
            let ttl: i64 = query(&mut b, &format!("TTL copy:{kind}"));
            assert!((59..=60).contains(&ttl), "{p} {kind}: TTL {ttl}");
        }
        assert_eq!(query::<Option<Vec<u8>>>(&mut a, "DUMP absent"), None, "{p}");

        let payload: Vec<u8> = query(&mut a, "DUMP src:list");
        let busy = redis::cmd("RESTORE").arg("copy:list").arg(0).arg(&payload).query::<Value>(&mut b);
        assert!(busy.unwrap_err().to_string().contains("BUSYKEY"), "{p}");
        let mut corrupted = payload.clone();
        corrupted[2] ^= 0x20;
        let refused = redis::cmd("RESTORE")
            .arg("copy:list")
            .arg(0)
            .arg(&corrupted)
            .arg("REPLACE")
            .query::<Value>(&mut b);
        let refused = refused.unwrap_err().to_string();
        assert!(refused.contains("DUMP payload version or checksum are wrong"), "{p}: {refused}");
        assert_eq!(query::<Vec<String>>(&mut c, "LRANGE copy:list 0 -1"), ["a", "b", "a"], "{p}: unchanged");
        let replaced: String = redis::cmd("RESTORE")
            .arg("copy:list")
            .arg(0)
            .arg(query::<Vec<u8>>(&mut a, "DUMP src:set"))
            .arg("REPLACE")
            .arg("IDLETIME")
            .arg(5)
            .query(&mut b)
            .unwrap();
        assert_eq!(replaced, "OK", "{p}");
        assert_eq!(query::<String>(&mut c, "TYPE copy:list"), "set", "{p}: REPLACE replicated");
        assert_eq!(query::<i64>(&mut a, "TTL copy:list"), -1, "{p}");
    }
}
