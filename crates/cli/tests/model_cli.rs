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
        (&["model", "--distribution", "pareto"][..], "unknown distribution"),
        (&["model", "paper", "--experiments", "paxos-made-simple"][..], "unknown experiment"),
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

/// `compare --against` starts no cluster: it models the saved real rows again with the given
/// table, keeps the real figures and the machine they ran on, and writes the errors against them.
#[test]
fn model_compare_against_a_saved_comparison_models_its_rows_again() {
    let (dir, costs) = scratch_with_costs("against");
    let saved = dir.join("saved.json");
    let comparison = r#"{"machine": {"nproc": 2, "cpu_model": "saved CPU", "kernel": "k"},
        "load_average": "0.5 0.5 0.5", "costs": {"source": "old", "client_request_ns": 1, "message_received_ns": 1,
        "message_sent_ns": 1, "reply_sent_ns": 1, "byte_ps": 1, "handle_ns": 1, "tick_ns": 1, "key_op_ns": 1, "sync_ns": 1,
        "client_op_ns": 1, "wake_ns": 1, "timer_wake_ns": 1, "wakeup_ns": 1},
        "write_percent": 20, "rounds": 3, "seconds": 3.0, "host_cores": 2, "rows": [
        {"protocol": "hermes", "clients": 1, "real_ops_per_s": 8000.0, "real_p50_us": 100.0,
         "real_rounds_ops_per_s": [8000.0], "real_cpu_us_per_op": 90.0, "real_cores_used": 1.0,
         "real_others_cores": 0.0, "real_cpu_share": 1.0,
         "model": {"ops_per_s": 0.0, "p50_us": 0.0, "cpu_us_per_op": 0.0, "throughput_error": 0.0, "p50_error": 0.0, "cpu_error": 0.0},
         "model_at_share": {"ops_per_s": 0.0, "p50_us": 0.0, "cpu_us_per_op": 0.0, "throughput_error": 0.0, "p50_error": 0.0, "cpu_error": 0.0}}]}"#;
    std::fs::write(&saved, comparison).expect("written");
    let out = dir.join("again.json");
    let compare_against = |json: &std::path::Path, extra: &[&str]| {
        let mut args = vec!["model", "compare", "--costs", costs.to_str().expect("utf-8")];
        args.extend(["--against", saved.to_str().expect("utf-8"), "--json", json.to_str().expect("utf-8")]);
        args.extend(extra);
        chorus(&args)
    };
    let output = compare_against(&out, &[]);
    let again: Result<serde_json::Value, _> = std::fs::read(&out)
        .map_err(|error| error.to_string())
        .and_then(|text| serde_json::from_slice(&text).map_err(|error| error.to_string()));
    // The same rows with each reply and frame leaving as it is written.
    let one_by_one = compare_against(&dir.join("one-by-one.json"), &["--writes-one-by-one"]);
    std::fs::remove_dir_all(&dir).expect("removed");
    assert!(one_by_one.status.success(), "{}", String::from_utf8_lossy(&one_by_one.stderr));
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let again = again.expect("the comparison written");
    assert_eq!(again["machine"]["cpu_model"], "saved CPU");
    assert_eq!(again["costs"]["source"], "calibrated here");
    let row = &again["rows"][0];
    assert_eq!(row["real_ops_per_s"], 8000.0);
    let modelled = row["model"]["ops_per_s"].as_f64().expect("a number");
    assert!(modelled > 0.0, "{row}");
    let error = row["model"]["throughput_error"].as_f64().expect("a number");
    assert!((error - (modelled / 8000.0 - 1.0)).abs() < 1e-9, "{row}");
    // The generator's CPU, not saved by that run, is what the run used beyond the nodes'.
    assert!((row["real_client_cpu_us_per_op"].as_f64().expect("a number") - 35.0).abs() < 1e-6, "{row}");
}

/// A scratch directory with a calibrated-looking cost table in it.
fn scratch_with_costs(name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("chorus-model-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let path = dir.join("costs.json");
    let table = r#"{"source": "calibrated here", "client_request_ns": 3000, "message_received_ns": 6000,
        "message_sent_ns": 6000, "reply_sent_ns": 3000, "byte_ps": 300, "handle_ns": 2000, "tick_ns": 3000, "key_op_ns": 600, "sync_ns": 200,
        "client_op_ns": 10000, "wake_ns": 8000, "timer_wake_ns": 20000, "wakeup_ns": 7000}"#;
    std::fs::write(&path, table).expect("written");
    (dir, path)
}

/// Capacity planning end to end: the chain store on RDMA under YCSB-A, one row per client
/// count, with the kernel-bypass costs named, and p50/p99 against throughput drawn to a PNG.
#[test]
fn model_plans_a_chain_on_rdma_under_ycsb_and_draws_latency_against_throughput() {
    let (dir, costs) = scratch_with_costs("plan");
    let plot = dir.join("plot.png");
    let output = chorus(&[
        "model",
        "--protocol",
        "chain",
        "--network",
        "rdma",
        "--workload",
        "ycsb-a",
        "--keys",
        "256",
        "--costs",
        costs.to_str().expect("utf-8"),
        "--clients",
        "1,4",
        "--duration-ms",
        "5",
        "--warmup-ms",
        "20",
        "--plot",
        plot.to_str().expect("utf-8"),
        "--json",
    ]);
    let png = std::fs::metadata(&plot).map(|meta| meta.len()).unwrap_or(0);
    std::fs::remove_dir_all(&dir).expect("removed");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let reports: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    let reports = reports.as_array().expect("an array");
    assert_eq!(reports.len(), 2);
    assert!(reports[0]["costs"]["source"].as_str().expect("a source").contains("kernel bypass"));
    assert_eq!(reports[0]["costs"]["wake_ns"], 0, "RDMA threads poll");
    assert_eq!(reports[0]["workload"]["mix"]["update"], 50);
    assert!(reports[1]["throughput_ops_per_s"].as_f64().expect("a number") > 0.0);
    assert!(reports[1]["write_latency"]["p99_us"].as_f64().expect("a number") > 0.0);
    assert!(png > 1_000, "the plot is a PNG of {png} bytes");
}

/// `chorus model paper` writes an experiment's JSON (with the paper's words beside the rows),
/// its tables and its figure.
#[test]
fn model_paper_writes_an_experiment_with_the_papers_numbers() {
    let (dir, costs) = scratch_with_costs("paper");
    let output = chorus(&[
        "model",
        "paper",
        "--quick",
        "--experiments",
        "groups",
        "--costs",
        costs.to_str().expect("utf-8"),
        "--costs-ghz",
        "2.5",
        "--out",
        dir.to_str().expect("utf-8"),
    ]);
    let json = std::fs::read_to_string(dir.join("groups-quick.json"));
    let table = std::fs::read_to_string(dir.join("groups-quick.md"));
    let png = std::fs::metadata(dir.join("groups-quick.png")).map(|meta| meta.len()).unwrap_or(0);
    std::fs::remove_dir_all(&dir).expect("removed");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let experiment: serde_json::Value = serde_json::from_str(&json.expect("the JSON")).expect("json");
    let rows = experiment["rows"].as_array().expect("rows");
    let throughput = |groups: f64, figure: &str| {
        rows.iter()
            .find(|row| row["x"] == groups && row["figure"] == figure)
            .and_then(|row| row["throughput_ops_per_s"].as_f64())
            .expect("a row")
    };
    // Groups on machines of their own share nothing: uniform GETs scale with them.
    assert!(throughput(3.0, "groups-get") > 2.5 * throughput(1.0, "groups-get"), "{rows:?}");
    assert!(!experiment["paper"].as_array().expect("the paper's words").is_empty());
    assert!(table.expect("the tables").contains("groups-get"));
    assert!(png > 1_000, "the figure is a PNG of {png} bytes");
}
