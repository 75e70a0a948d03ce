//! MULTI/EXEC on one key and WATCH, through the real binary on every protocol (issue 19,
//! point 4): a transaction on one key is one replicated RMW, so it is atomic everywhere, and
//! WATCH makes EXEC run only if the watched key still holds what WATCH read.

use std::thread;

use redis::Value;
use support::loopback::Cluster;
use support::query;

mod support;

const PROTOCOLS: [&str; 5] = ["hermes", "craq", "zab", "raftlog", "chain"];
const WORKERS: usize = 3;
const INCREMENTS: usize = 12;

/// The optimistic increment Redis' documentation teaches: WATCH, read, MULTI, write, EXEC,
/// again if EXEC answered nil. Returns how many EXECs were aborted.
fn increment_with_watch(con: &mut redis::Connection) -> usize {
    let mut aborted = 0;
    loop {
        query::<()>(con, "WATCH counter");
        let now: Option<i64> = query(con, "GET counter");
        query::<()>(con, "MULTI");
        let queued: String = query(con, &format!("SET counter {}", now.unwrap_or(0) + 1));
        assert_eq!(queued, "QUEUED");
        match query::<Value>(con, "EXEC") {
            Value::Nil => aborted += 1,
            Value::Array(replies) if replies.len() == 1 => return aborted,
            other => panic!("EXEC answered {other:?}"),
        }
    }
}

#[test]
fn watch_and_one_key_transactions_are_atomic_on_every_protocol() {
    for protocol in PROTOCOLS {
        let cluster = Cluster::start(3, &["--protocol", protocol]);
        let (mut a, mut b) = (cluster.client(0), cluster.client(1));
        let p = protocol;

        // Several commands on one key, one array of replies.
        query::<()>(&mut a, "MULTI");
        for line in ["SET k 1", "INCR k", "APPEND k 0", "GET k"] {
            assert_eq!(query::<String>(&mut a, line), "QUEUED", "{p}");
        }
        let (set, incr, append, get): (String, i64, i64, String) = query(&mut a, "EXEC");
        assert_eq!((set.as_str(), incr, append, get.as_str()), ("OK", 2, 2, "20"), "{p}");

        // A watched key written by another client (at another replica) aborts EXEC.
        query::<()>(&mut a, "WATCH k");
        query::<()>(&mut b, "SET k theirs");
        query::<()>(&mut a, "MULTI");
        query::<String>(&mut a, "SET k mine");
        assert_eq!(query::<Value>(&mut a, "EXEC"), Value::Nil, "{p}");
        assert_eq!(query::<String>(&mut b, "GET k"), "theirs", "{p}");
        // EXEC unwatched it: the next transaction runs.
        query::<()>(&mut a, "MULTI");
        query::<String>(&mut a, "SET k mine");
        assert_eq!(query::<Vec<String>>(&mut a, "EXEC"), ["OK"], "{p}");

        // Over several keys: only raftlog, and nothing runs elsewhere.
        query::<()>(&mut a, "MULTI");
        query::<String>(&mut a, "SET x 1");
        query::<String>(&mut a, "SET y 1");
        let exec = redis::cmd("EXEC").query::<Value>(&mut a);
        if protocol == "raftlog" {
            assert!(exec.is_ok(), "{p}: {exec:?}");
        } else {
            let error = exec.unwrap_err().to_string();
            assert!(error.contains("only atomic with protocol raftlog"), "{p}: {error}");
            assert_eq!(query::<Option<String>>(&mut b, "GET x"), None, "{p}");
        }

        // Optimistic increments from every replica at once lose nothing.
        let workers: Vec<_> = (0..WORKERS)
            .map(|worker| {
                let mut con = cluster.client(worker % 3);
                thread::spawn(move || (0..INCREMENTS).map(|_| increment_with_watch(&mut con)).sum::<usize>())
            })
            .collect();
        let aborted: usize = workers.into_iter().map(|worker| worker.join().unwrap()).sum();
        let total: i64 = query(&mut a, "GET counter");
        assert_eq!(total, (WORKERS * INCREMENTS) as i64, "{p}: increments lost ({aborted} EXECs aborted)");
        eprintln!("{p}: {aborted} of {} EXECs aborted by WATCH", aborted + WORKERS * INCREMENTS);
    }
}
