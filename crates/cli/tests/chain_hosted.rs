//! `chorus up --protocol chain --datapath user` (issue 17 point 5): the chain's members run on
//! a group host per node (`chorus group-host`), not in the nodes' event loops. Through the
//! real binary: the hosts carry every operation (stopped hosts stop the writes while every
//! node runs), the history of concurrent clients across a SIGKILL of the head is
//! linearizable, and the survivors go on with what was acknowledged.

use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use support::scratch::Scratch;
use support::up::{client, free_port_run, Up};
use support::workload;

mod support;

/// The pid of the `chorus group-host` listening on `port` (a child of `chorus up`).
fn host_pid(port: u16) -> u32 {
    let listen = format!("127.0.0.1:{port}");
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let args: Vec<String> =
            cmdline.split(|b| *b == 0).map(|arg| String::from_utf8_lossy(arg).into_owned()).collect();
        if args.iter().any(|arg| arg == "group-host") && args.contains(&listen) {
            return pid;
        }
    }
    panic!("no group host listens on {listen}");
}

fn node_pid(port: u16) -> i32 {
    let hosts: Vec<i32> = (6..9).map(|i| host_pid(port + i) as i32).collect();
    hosts.iter().for_each(|pid| signal(*pid, libc::SIGSTOP));
    let mut con = client(port);
    con.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let stalled = redis::cmd("SET").arg("k").arg("v1").query::<()>(&mut con);
    hosts.iter().for_each(|pid| signal(*pid, libc::SIGCONT));
    assert!(stalled.is_err(), "a write completed while the group hosts were stopped");
    // Retransmitted by the coordinator once the host runs again.
    wait_for_value(port + 2, "k", "v1");

    // Concurrent clients on every node; the head (the coordinator) is SIGKILLed mid-load.
    let targets: Vec<String> = (0..3).map(|i| format!("127.0.0.1:{}", port + i)).collect();
    let (stop, clients) = workload::spawn_until_stopped(targets);
    thread::sleep(Duration::from_millis(700));
    signal(node_pid(port), libc::SIGKILL);
    thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    let history = clients.join().unwrap();
    workload::check_across_crashes(&history, 50);

    // The survivors re-chained on their hosts: a write at the new head reaches the tail.
    let _: () = redis::cmd("SET").arg("after").arg("kill").query(&mut client(port + 1)).unwrap();
    wait_for_value(port + 2, "after", "kill");
    wait_for_value(port + 1, "k", "v1");
    drop(up);

    let error = Up::start(port, 3, &["--datapath", "user"], &[]).err().expect("hermes has no group hosts");
    assert!(error.contains("only applies to --protocol chain"), "{error}");
    let error = Up::start(port, 3, &["--protocol", "chain", "--datapath", "kernel"], &[])
        .err()
        .expect("the kernel path is not wired to the chain yet");
    assert!(error.contains("--datapath kernel"), "{error}");
}
