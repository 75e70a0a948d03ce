//! `chorus model` end to end through the binary: a prediction per client count, as JSON, and
//! clear errors for what it cannot model.

use std::process::Command;

fn chorus(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_chorus")).args(args).output().expect("chorus runs")
}

#[test]
fn model_prints_one_prediction_per_client_count() {
    let output = chorus(&[
        "model",
        "--protocol",
        "hermes",
        "--nodes",
        "3",
        "--cores",
        "4",
        "--network",
        "25gbe",
        "--clients",
        "1,8",
        "--duration-ms",
        "20",
        "--warmup-ms",
        "20",
        "--json",
    ]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let reports: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    let reports = reports.as_array().expect("an array");
    assert_eq!(reports.len(), 2);
    let throughput = |index: usize| reports[index]["throughput_ops_per_s"].as_f64().expect("a number");
    assert!(throughput(0) > 0.0);
    // Eight closed-loop clients on an idle cluster get more done than one.
    assert!(throughput(1) > 2.0 * throughput(0), "{reports:?}");
    assert!(reports[0]["costs"]["source"].as_str().expect("a source").contains("placeholder"));
}

#[test]
fn model_refuses_what_it_cannot_model() {
    for (args, error) in [
        (&["model", "--network", "carrier-pigeon"][..], "unknown network"),
        (&["model", "--protocol", "paxos"][..], "unknown protocol"),
        (&["model", "--workload", "kv-w101"][..], "unknown workload"),
        (&["model", "--costs", "/nonexistent/costs.json"][..], "cannot read"),
        (&["model", "compare", "--costs", "/nonexistent/costs.json"][..], "cannot read"),
        (&["model", "calibrate", "--rounds", "0"][..], "must be positive"),
    ] {
        let output = chorus(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&output.stderr).contains(error), "{args:?}");
    }
}

/// A calibrated table (as `chorus model calibrate` writes it) drives a prediction of a
/// cluster, and the table's source is printed with it.
#[test]
fn model_reads_a_calibrated_table() {
    let dir = std::env::temp_dir().join(format!("chorus-model-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let path = dir.join("costs.json");
    let table = r#"{"source": "calibrated here", "client_request_ns": 3000, "message_received_ns": 2000,
        "message_sent_ns": 2000, "reply_sent_ns": 1500, "byte_ps": 400, "handle_ns": 450, "tick_ns": 900, "key_op_ns": 250, "sync_ns": 200,
        "client_op_ns": 20000, "wake_ns": 30000, "timer_wake_ns": 30000, "wakeup_ns": 7000}"#;
    std::fs::write(&path, table).expect("written");
    let output = chorus(&[
        "model",
        "--costs",
        path.to_str().expect("utf-8"),
        "--clients",
        "4",
        "--duration-ms",
        "20",
        "--warmup-ms",
        "20",
        "--json",
    ]);
    std::fs::remove_dir_all(&dir).expect("removed");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let reports: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(reports[0]["costs"]["source"], "calibrated here");
    assert_eq!(reports[0]["costs"]["wake_ns"], 30000);
    assert!(reports[0]["nodes_cpu_us_per_op"].as_f64().expect("a number") > 0.0);
}
