//! `chorus up --protocol chain --datapath user` (issue 17 point 5): the chain's members run on
//! a group host per node (`chorus group-host`), not in the nodes' event loops. Through the
//! real binary: the hosts carry every operation (stopped hosts stop the writes while every
//! node runs), the history of concurrent clients across a SIGKILL of the head is
//! linearizable, the survivors go on with what was acknowledged, and the killed node
//! restarted on its directory is copied to and linked through its host.

use std::sync::atomic::Ordering;
use std::thread;
use std::time::Duration;

use support::scratch::Scratch;
use support::send_signal;
use support::torn;
use support::up::{client, free_port_run, node_pid, set_retrying, wait_for_value, KillOnDrop, Up};
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

#[test]
fn chorus_up_chain_runs_its_members_on_group_hosts() {
    let scratch = Scratch::new("chain-hosted");
    let port = free_port_run(9, 3);
    let dir = scratch.0.join("cluster");
    let host_port = (port + 6).to_string();
    let args = [
        "--protocol",
        "chain",
        "--datapath",
        "user",
        "--group-host-port",
        &host_port,
        "--data-dir",
        dir.to_str().unwrap(),
    ];
    // To follow a failure: e.g. CHORUS_TEST_LOG_LEVEL=info,chorus_server=debug,chorus_group=debug
    // and CHORUS_KEEP_SCRATCH=1 keep the nodes' and hosts' logs (node-<i>.log, node-<i>.host.log).
    let level = std::env::var("CHORUS_TEST_LOG_LEVEL").unwrap_or_else(|_| "info".into());
    let mut args = args.to_vec();
    args.extend(["--log-level", &level]);
    let (up, first) = Up::start(port, 3, &args, &[]).unwrap();
    assert!(first.contains("3 chain replicas up"), "{first}");
    let _: () = redis::cmd("SET").arg("k").arg("v0").query(&mut client(port)).unwrap();
    wait_for_value(port + 2, "k", "v0");

    // The hosts stopped, every node running: a write cannot complete, since the hosts apply
    // and forward it (with members in the event loops it would). All of them, because which
    // node is linked where depends on the views so far (a node slow to start may have been
    // removed and joined again as the tail).
    let hosts: Vec<i32> = (6..9).map(|i| host_pid(port + i) as i32).collect();
    hosts.iter().for_each(|pid| send_signal(*pid, libc::SIGSTOP));
    let mut con = client(port);
    con.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let stalled = redis::cmd("SET").arg("k").arg("v1").query::<()>(&mut con);
    hosts.iter().for_each(|pid| send_signal(*pid, libc::SIGCONT));
    assert!(stalled.is_err(), "a write completed while the group hosts were stopped");
    // Retransmitted by the coordinator once the host runs again.
    wait_for_value(port + 2, "k", "v1");

    // Concurrent clients on every node; the head (the coordinator) is SIGKILLed mid-load.
    let targets: Vec<String> = (0..3).map(|i| format!("127.0.0.1:{}", port + i)).collect();
    let (stop, clients) = workload::spawn_until_stopped(targets);
    thread::sleep(Duration::from_millis(700));
    send_signal(node_pid(port), libc::SIGKILL);
    thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    let history = clients.join().unwrap();
    workload::check_across_crashes(&history, 50);

    // The survivors re-chained on their hosts: a write at the new head reaches the tail.
    set_retrying(port + 1, "after", "kill");
    wait_for_value(port + 2, "after", "kill");
    wait_for_value(port + 1, "k", "v1");

    // The killed node restarted on its directory joins (§5.1): the new head copies its region
    // to it through the copy group on its host, links it as the tail, and it serves.
    let node0 = std::process::Command::new(env!("CARGO_BIN_EXE_chorus"))
        .args(["node", "--config", dir.join("node-0.toml").to_str().unwrap()])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let node0 = KillOnDrop(node0);
    wait_for_value(port, "after", "kill");
    set_retrying(port, "through", "joiner");
    wait_for_value(port + 1, "through", "joiner");
    drop(node0);
    drop(up);

    let error = Up::start(port, 3, &["--datapath", "user"], &[]).err().expect("hermes has no group hosts");
    assert!(error.contains("only applies to --protocol chain"), "{error}");
    let error =
        Up::start(port, 3, &["--protocol", "chain", "--datapath", "kernel", "--chain-shape", "server"], &[])
            .err()
            .expect("a 69 MiB region does not fit a kernel slot");
    assert!(error.contains("--chain-shape kernel") || error.contains("unavailable"), "{error}");
}

/// Tail reads on members hosted by the group host (issue 17): the host applies each execute
/// to the shared region while the tail's node looks the key up in it, so the tail reads under
/// its reader count like any member (docs/protocols/chain.md, "Tail reads"). Reads at the tail
/// racing a stream of writes of one key (4000-byte values, every byte of value i the same)
/// each return one whole value that was written.
#[test]
fn tail_reads_on_group_hosts_see_whole_values_while_the_host_executes() {
    let scratch = Scratch::new("chain-hosted-torn");
    let port = free_port_run(9, 10);
    let dir = scratch.0.join("cluster");
    let (up, _) = Up::hosted_chain(port, "user", &dir);
    torn::assert_tail_reads_are_whole(port, 1);
    up.stop();
}
