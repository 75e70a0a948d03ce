//! `chorus bench tenants` through the real binary (HyperLoop §2.2, §6.2): a tiny run of every
//! arrangement (one `chorus group-host` per host for chain; `chorus naive-replica` processes
//! per tenant for Naïve; one `chorus node --protocol hermes` per host for Hermes) writes a
//! report with one point per protocol and tenant count, the replicas' CPU from /proc, and the
//! two figures; `--from-json` redraws them; an unknown protocol is a clear error. Nothing here
//! looks at how fast anything was.

mod support;

use std::process::{Command, Stdio};
use support::scratch::Scratch;

fn assert_pngs(dir: &std::path::Path) {
    for figure in ["tenants-latency", "tenants-cpu"] {
        let png = std::fs::read(dir.join(format!("{figure}.png"))).unwrap();
        assert_eq!(&png[1..4], b"PNG", "{figure}");
    }
}

/// `chorus bench tenants` with every protocol and `args`, its report in `out`: the summary it
/// printed and the report it saved.
fn run_bench(args: &[&str], out: &std::path::Path) -> (String, serde_json::Value) {
    let output = Command::new(env!("CARGO_BIN_EXE_chorus"))
        .args(["bench", "tenants", "--protocol", "chain,naive,hermes"])
        .args(args)
        .arg("--out")
        .arg(out)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(output.status.success());
    let report = serde_json::from_slice(&std::fs::read(out.join("tenants.json")).unwrap()).unwrap();
    (String::from_utf8_lossy(&output.stdout).into_owned(), report)
}

#[test]
fn bench_tenants_writes_one_point_per_protocol_and_tenant_count_and_the_figures() {
    let scratch = Scratch::new("tenants-cli-run");
    let (stdout, report) = run_bench(&["--tenants", "1,2", "--measure-s", "0.5"], &scratch.0);
    for name in ["chain", "hermes"] {
        let expected = format!("target (T=32, background load) for {name}: not measured");
        assert!(stdout.contains(&expected), "{stdout}");
        assert!(stdout.contains(&format!("ratios to {name}")), "{stdout}");
    }
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 6, "{results:?}");
    for (mode, processes) in [("chorus", [3, 3]), ("naive", [6, 9]), ("hermes", [3, 3])] {
        for (t, expected) in [1, 2].into_iter().zip(processes) {
            let r = results.iter().find(|r| r["mode"] == mode && r["tenants"] == t).expect("point");
            assert!(r["updates"].as_u64().unwrap() > 0, "{r}");
            assert!(r["reads"].as_u64().unwrap() > 0, "{r}");
            let (avg, p95, p99) = (
                r["update_mean_us"].as_f64().unwrap(),
                r["update_p95_us"].as_f64().unwrap(),
                r["update_p99_us"].as_f64().unwrap(),
            );
            assert!(avg > 0.0 && p95 > 0.0 && p99 >= p95, "{r}");
            assert!(r["replica_cpu_us_per_op"].is_number(), "CPU per op from /proc: {r}");
            assert_eq!(r["replica_processes"], expected, "{r}");
            assert_eq!(r["background_load"], false);
            assert_eq!(r["replicas_fifo"], false, "the default class without --fifo: {r}");
        }
    }
    assert_pngs(&scratch.0);

    // Redraw from the saved report into another directory.
    let again = Scratch::new("tenants-cli-redraw");
    std::fs::copy(scratch.0.join("tenants.json"), again.0.join("tenants.json")).unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_chorus"))
        .args(["bench", "tenants", "--from-json"])
        .arg(again.0.join("tenants.json"))
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    assert_pngs(&again.0);
}

/// `--fifo` starts every replica (group hosts, which fork the Naïve replicas, and Hermes
/// nodes) under SCHED_FIFO, seen in /proc while measuring; `--rounds 2` makes one median
/// point of two. Needs root (a real-time class); skipped otherwise.
#[test]
fn bench_tenants_fifo_runs_the_replicas_real_time_and_rounds_take_medians() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: SCHED_FIFO needs root");
        return;
    }
    let scratch = Scratch::new("tenants-cli-fifo");
    let args = ["--tenants", "1", "--measure-s", "0.3", "--fifo", "--rounds", "2"];
    let (stdout, report) = run_bench(&args, &scratch.0);
    assert!(stdout.contains("SCHED_FIFO") && stdout.contains("median of 2"), "{stdout}");
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 3, "one point per protocol: {results:?}");
    for r in results {
        assert_eq!(r["replicas_fifo"], true, "{r}");
        assert_eq!(r["rounds"], 2, "{r}");
        assert_eq!(r["update_p99_rounds_us"].as_array().unwrap().len(), 2, "{r}");
    }
}

#[test]
fn bench_tenants_refuses_unknown_protocols_clearly() {
    for (protocol, expected) in [("paxos", "unknown protocol"), ("chain,raft", "unknown protocol")] {
        let output = Command::new(env!("CARGO_BIN_EXE_chorus"))
            .args(["bench", "tenants", "--tenants", "1", "--protocol", protocol, "--out"])
            .arg(std::env::temp_dir().join("chorus-tenants-cli-never-written"))
            .output()
            .unwrap();
        assert!(!output.status.success(), "{protocol}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{protocol}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
