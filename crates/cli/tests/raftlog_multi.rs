//! RESP MULTI/EXEC through the real binary (issue 8 point 5, issue 18 point 3): atomic across
//! raftlog's logs, as ganged operations (the default) and with two-phase locking; refused
//! (not faked) over several keys by protocols that cannot make it atomic.

mod support;

use std::thread;

use support::loopback::Cluster;

const ACCOUNTS: usize = 6;

fn queued(con: &mut redis::Connection, args: &[&str]) {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    let reply: String = cmd.query(con).unwrap();
    assert_eq!(reply, "QUEUED", "{args:?}");
}

#[test]
fn multi_exec_is_atomic_across_raftlog_logs_and_refused_elsewhere() {
    let cluster = Cluster::start(3, &["--protocol", "raftlog"]);
    let mut con = cluster.client(1);

    // The Redis shape: OK, QUEUED..., then one array of replies.
    let _: () = redis::cmd("MULTI").query(&mut con).unwrap();
    queued(&mut con, &["SET", "a", "1"]);
    queued(&mut con, &["INCRBY", "b", "5"]);
    queued(&mut con, &["GET", "a"]);
    queued(&mut con, &["SETNX", "a", "2"]);
    let (set, incr, get, setnx): (String, i64, String, i64) = redis::cmd("EXEC").query(&mut con).unwrap();
    assert_eq!((set.as_str(), incr, get.as_str(), setnx), ("OK", 5, "1", 0));

    // Errors: Redis's messages and behaviour.
    let error = redis::cmd("EXEC").query::<()>(&mut con).unwrap_err();
    assert!(error.to_string().contains("EXEC without MULTI"), "{error}");
    let _: () = redis::cmd("MULTI").query(&mut con).unwrap();
    let error = redis::cmd("MGET").arg("a").arg("b").query::<()>(&mut con).unwrap_err();
    assert!(error.to_string().contains("single-key"), "{error}");
    let error = redis::cmd("EXEC").query::<()>(&mut con).unwrap_err();
    assert!(error.to_string().contains("Transaction discarded because of previous errors"), "{error}");
    let _: () = redis::cmd("MULTI").query(&mut con).unwrap();
    queued(&mut con, &["SET", "a", "never"]);
    let _: () = redis::cmd("DISCARD").query(&mut con).unwrap();
    let a: String = redis::cmd("GET").arg("a").query(&mut con).unwrap();
    assert_eq!(a, "1", "DISCARD threw the queued SET away");

    bank(&cluster);
    // Ganged operations ran them, not the locking transactions.
    let gangs: u64 = (0..3).filter_map(|node| cluster.info_number(node, "raftlog_gangs_executed")).sum();
    let txns: u64 = (0..3).filter_map(|node| cluster.info_number(node, "raftlog_txns_started")).sum();
    assert!(gangs > 100 && txns == 0, "gangs executed {gangs}, locking transactions {txns}");
    drop(cluster);

    let cluster = Cluster::start(3, &["--protocol", "raftlog", "--raftlog-transactions", "locking"]);
    bank(&cluster);
    let txns: u64 = (0..3).filter_map(|node| cluster.info_number(node, "raftlog_txns_started")).sum();
    assert!(txns > 100, "locking transactions {txns}");
    // Finished transactions are forgotten: each left at least 5 step records per replica
    // before (a `Lock` and an `Update` per participant log, a `Finish`); now only those of
    // transactions begun after what the last `Forget` a log applied covers remain.
    let forgets: u64 =
        (0..3).filter_map(|node| cluster.info_number(node, "raftlog_txn_forgets_applied")).sum();
    let records: u64 = (0..3).filter_map(|node| cluster.info_number(node, "raftlog_txn_step_records")).sum();
    assert!(
        forgets > 0 && records < txns,
        "{forgets} Forget steps applied, {records} step records for {txns} transactions"
    );
    drop(cluster);

    // Another protocol: a transaction over several keys is refused at EXEC, naming the
    // protocol that can, rather than run the commands one by one; nothing was written.
    let cluster = Cluster::start(3, &["--protocol", "craq"]);
    let mut con = cluster.client(0);
    let _: () = redis::cmd("MULTI").query(&mut con).unwrap();
    queued(&mut con, &["SET", "a", "1"]);
    queued(&mut con, &["SET", "b", "1"]);
    let error = redis::cmd("EXEC").query::<()>(&mut con).unwrap_err();
    assert!(error.to_string().contains("only atomic with protocol raftlog"), "{error}");
    let a: Option<String> = redis::cmd("GET").arg("a").query(&mut con).unwrap();
    assert_eq!(a, None);
}

/// A bank: transfers and audits as transactions from every node at once, plain commands on
/// the same keys in between; every audit must see the opening total.
fn bank(cluster: &Cluster) {
    let mut con = cluster.client(1);
    let mut opening = redis::cmd("MSET");
    for i in 0..ACCOUNTS {
        opening.arg(format!("acct:{i}")).arg(100);
    }
    let _: () = opening.query(&mut con).unwrap();
    let workers: Vec<_> = (0..6)
        .map(|worker| {
            let mut con = cluster.client(worker % 3);
            thread::spawn(move || {
                let mut audits = Vec::new();
                for round in 0..40usize {
                    let (from, to) = ((worker + round) % ACCOUNTS, (worker + 2 * round + 1) % ACCOUNTS);
                    if round % 3 == 0 || from == to {
                        let _: () = redis::cmd("MULTI").query(&mut con).unwrap();
                        for i in 0..ACCOUNTS {
                            queued(&mut con, &["GET", &format!("acct:{i}")]);
                        }
                        let balances: Vec<i64> = redis::cmd("EXEC").query(&mut con).unwrap();
                        audits.push(balances.iter().sum::<i64>());
                    } else {
                        let amount = (round % 7 + 1).to_string();
                        let _: () = redis::cmd("MULTI").query(&mut con).unwrap();
                        queued(&mut con, &["DECRBY", &format!("acct:{from}"), &amount]);
                        queued(&mut con, &["INCRBY", &format!("acct:{to}"), &amount]);
                        let _: (i64, i64) = redis::cmd("EXEC").query(&mut con).unwrap();
                    }
                    // Plain commands on the same keys interleave with the transactions.
                    let _: i64 =
                        redis::cmd("INCRBY").arg(format!("acct:{to}")).arg(0).query(&mut con).unwrap();
                }
                audits
            })
        })
        .collect();
    let audits: Vec<i64> = workers.into_iter().flat_map(|worker| worker.join().unwrap()).collect();
    assert!(audits.len() > 50, "{}", audits.len());
    assert!(
        audits.iter().all(|sum| *sum == 100 * ACCOUNTS as i64),
        "an audit saw a partial transfer: {audits:?}"
    );
    let info: String = redis::cmd("INFO").query(&mut cluster.client(0)).unwrap();
    eprintln!(
        "{}",
        info.lines()
            .filter(|line| line.contains("txn") || line.contains("gang"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
