//! etcd measured the way etcd measures itself: its own benchmark tool
//! (`go.etcd.io/etcd/v3/tools/benchmark`), a Go program speaking native gRPC, with one gRPC
//! connection per client so that every system gets one connection per closed-loop client.
//!
//! The tool is built on first use with the Go toolchain (`go build` of a throw-away module
//! that requires etcd at [`TOOL_VERSION`]; Go installs from Debian's `golang-go` when
//! missing) into `~/.cache/chorus-bench/`, or taken from `CHORUS_ETCD_BENCHMARK`. Debian
//! bookworm packages etcd 3.4.23, whose tools are not published as a Go module; the 3.5 tool
//! speaks the same v3 gRPC API.
//!
//! It measures two workloads: `put` (random keys of a key space: `kv-w100`) and `range` of one
//! key with linearizable consistency (`kv-w0`). It runs a number of requests, not a duration:
//! [`requests_for`] sizes each run from the rate of the previous one.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context as _};

use crate::procs;
use crate::report::{Latency, OpStats, Report};

/// The etcd release whose benchmark tool is built.
pub const TOOL_VERSION: &str = "v3.5.11";

/// The key `range` reads (written by `compare` when the cluster starts).
pub const RANGE_KEY: &str = "chorus-bench-ready";

/// What one run of the tool does.
#[derive(Clone, Debug)]
pub enum ToolWorkload {
    /// Puts of `value_bytes` under random keys of `key_space` keys of 16 bytes.
    Put { key_space: u64, value_bytes: usize },
    /// Linearizable reads of [`RANGE_KEY`].
    Range,
}

/// The tool's path: `CHORUS_ETCD_BENCHMARK`, the cached build, or a fresh build (when
/// `install`).
pub fn ensure_tool(install: bool) -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("CHORUS_ETCD_BENCHMARK") {
        let path = PathBuf::from(path);
        anyhow::ensure!(path.is_file(), "CHORUS_ETCD_BENCHMARK={} is not a file", path.display());
        return Ok(path);
    }
    let cache = cache_dir();
    let tool = cache.join(format!("etcd-benchmark-{TOOL_VERSION}"));
    if tool.is_file() {
        return Ok(tool);
    }
    if !install {
        bail!(
            "etcd's benchmark tool is not built ({} missing; drop --no-install to build it)",
            tool.display()
        );
    }
    let go = procs::ensure_program("go", &["/usr/local/go/bin/go", "/usr/lib/go/bin/go"], "golang-go", true)?;
    build(&go, &cache.join("etcd-benchmark-src"), &tool)?;
    Ok(tool)
}

fn cache_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("chorus-bench")
}

/// `go build` the tool into `output` from a module in `src` that requires etcd (a module
/// whose go.mod has replace directives cannot be `go install`ed directly).
fn build(go: &Path, src: &Path, output: &Path) -> anyhow::Result<()> {
    eprintln!("chorus bench: building etcd's benchmark tool {TOOL_VERSION} with {} (once)", go.display());
    std::fs::create_dir_all(src).with_context(|| format!("cannot create {}", src.display()))?;
    let go_mod =
        format!("module chorus-bench-etcd-tool\n\ngo 1.20\n\nrequire go.etcd.io/etcd/v3 {TOOL_VERSION}\n");
    std::fs::write(src.join("go.mod"), go_mod)?;
    std::fs::write(
        src.join("tools.go"),
        "//go:build tools\n\npackage tools\n\nimport _ \"go.etcd.io/etcd/v3/tools/benchmark\"\n",
    )?;
    let run = |args: &[&str]| -> anyhow::Result<()> {
        let status = Command::new(go)
            .args(args)
            .current_dir(src)
            .stdin(Stdio::null())
            .status()
            .with_context(|| format!("cannot run {} {}", go.display(), args.join(" ")))?;
        anyhow::ensure!(status.success(), "{} {} failed ({status})", go.display(), args.join(" "));
        Ok(())
    };
    run(&["mod", "tidy"])?;
    let partial = output.with_extension("partial");
    run(&["build", "-o", &partial.to_string_lossy(), "go.etcd.io/etcd/v3/tools/benchmark"])?;
    std::fs::rename(&partial, output)?;
    Ok(())
}

/// The tool's command line for one run.
pub fn arguments(
    endpoints: &[SocketAddr],
    clients: usize,
    requests: u64,
    workload: &ToolWorkload,
) -> Vec<String> {
    let endpoints: Vec<String> = endpoints.iter().map(|e| e.to_string()).collect();
    let mut args = vec![
        format!("--endpoints={}", endpoints.join(",")),
        format!("--clients={clients}"),
        // One gRPC connection per client, as every other system gets one TCP connection per client.
        format!("--conns={clients}"),
        "--precise".to_string(),
    ];
    match workload {
        ToolWorkload::Put { key_space, value_bytes } => args.extend([
            "put".to_string(),
            "--key-size=16".to_string(),
            format!("--val-size={value_bytes}"),
            format!("--key-space-size={key_space}"),
            format!("--total={requests}"),
        ]),
        ToolWorkload::Range => args.extend([
            "range".to_string(),
            RANGE_KEY.to_string(),
            "--consistency=l".to_string(),
            format!("--total={requests}"),
        ]),
    }
    args
}

/// Requests for a run of about `seconds` at `rate` (the last run's), at least 50 per client
/// and at least 2000 (the tool prints no 99.9th percentile under 1000 requests).
pub fn requests_for(rate: Option<f64>, seconds: f64, clients: usize) -> u64 {
    let floor = (50 * clients as u64).max(2000);
    match rate {
        Some(rate) if rate > 0.0 => ((rate * seconds) as u64).max(floor),
        _ => floor,
    }
}

/// Run the tool once and read its summary.
pub fn run(tool: &Path, args: &[String]) -> anyhow::Result<Report> {
    let output = Command::new(tool)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", tool.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "{} {} failed ({}): {}",
            tool.display(),
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    parse_summary(&stdout).with_context(|| format!("reading the output of {}", tool.display()))
}

/// Parse the tool's summary (`Total`, `Slowest`, `Fastest`, `Average`, `Requests/sec`, the
/// latency distribution and the error distribution) into a report.
pub fn parse_summary(text: &str) -> anyhow::Result<Report> {
    let mut total_s = None;
    let mut rate = None;
    let mut latency = Latency::default();
    let mut errors = 0u64;
    let mut first_error = None;
    let mut in_errors = false;
    let seconds = |value: &str| -> Option<f64> {
        value.trim().trim_end_matches('.').trim_end_matches("secs").trim().parse().ok()
    };
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with("Error distribution") {
            in_errors = true;
            continue;
        }
        if in_errors {
            // `[count]\terror`
            if let Some((count, error)) = line.strip_prefix('[').and_then(|rest| rest.split_once(']')) {
                errors += count.parse::<u64>().unwrap_or(0);
                first_error.get_or_insert_with(|| error.trim().to_string());
            }
            continue;
        }
        let Some((name, value)) = line.split_once(':').or_else(|| line.split_once(" in ")) else { continue };
        let us = |value: &str| seconds(value).map(|s| s * 1e6);
        match name.trim() {
            "Total" => total_s = seconds(value),
            "Requests/sec" => rate = value.trim().parse::<f64>().ok(),
            "Slowest" => latency.max_us = us(value).unwrap_or(0.0),
            "Fastest" => latency.min_us = us(value).unwrap_or(0.0),
            "Average" => latency.mean_us = us(value).unwrap_or(0.0),
            "50%" => latency.p50_us = us(value).unwrap_or(0.0),
            "95%" => latency.p95_us = us(value).unwrap_or(0.0),
            "99%" => latency.p99_us = us(value).unwrap_or(0.0),
            "99.9%" => latency.p99_9_us = us(value).unwrap_or(0.0),
            _ => {}
        }
    }
    let (Some(elapsed_s), Some(ops_per_s)) = (total_s, rate) else {
        bail!("no summary (Total, Requests/sec) in:\n{text}");
    };
    let count = (ops_per_s * elapsed_s).round() as u64;
    let overall = OpStats {
        operation: "ALL".to_string(),
        count,
        errors,
        ops_per_s: (count + errors) as f64 / elapsed_s.max(1e-9),
        latency,
    };
    Ok(Report {
        elapsed_s,
        operations: count + errors,
        errors,
        ops_per_s: overall.ops_per_s,
        by_operation: vec![overall.clone()],
        overall,
        first_error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "bench with linearizable range\n\nSummary:\n  Total:\t2.0000 secs.\n  Slowest:\t0.0300 secs.\n  Fastest:\t0.0002 secs.\n  Average:\t0.0010 secs.\n  Stddev:\t0.0004 secs.\n  Requests/sec:\t5000.0000\n\nResponse time histogram:\n  0.0002 [1]\t|\n\nLatency distribution:\n  10% in 0.0005 secs.\n  50% in 0.0009 secs.\n  95% in 0.0020 secs.\n  99% in 0.0040 secs.\n  99.9% in 0.0100 secs.\n\nError distribution:\n  [3]\tcontext deadline exceeded\n";

    #[test]
    fn the_summary_becomes_a_report() {
        let report = parse_summary(SAMPLE).unwrap();
        assert_eq!(report.errors, 3);
        assert_eq!(report.operations, 10_003);
        assert!((report.elapsed_s - 2.0).abs() < 1e-9);
        let l = &report.overall.latency;
        assert!((l.p50_us - 900.0).abs() < 1e-6, "{l:?}");
        assert!((l.p99_us - 4000.0).abs() < 1e-6, "{l:?}");
        assert!((l.p99_9_us - 10_000.0).abs() < 1e-6, "{l:?}");
        assert!((l.max_us - 30_000.0).abs() < 1e-6, "{l:?}");
        assert_eq!(report.first_error.as_deref(), Some("context deadline exceeded"));
    }

    #[test]
    fn output_without_a_summary_is_an_error() {
        assert!(parse_summary("Error: context deadline exceeded\n").is_err());
    }

    #[test]
    fn one_connection_per_client() {
        let endpoints = ["127.0.0.1:1".parse().unwrap(), "127.0.0.1:2".parse().unwrap()];
        let args = arguments(&endpoints, 64, 1000, &ToolWorkload::Range);
        assert!(args.contains(&"--clients=64".to_string()));
        assert!(args.contains(&"--conns=64".to_string()));
        assert!(args.contains(&"--consistency=l".to_string()));
        assert!(args.contains(&"--endpoints=127.0.0.1:1,127.0.0.1:2".to_string()));
        assert_eq!(requests_for(None, 2.0, 64), 3200);
        assert_eq!(requests_for(Some(100.0), 2.0, 1), 2000);
        assert_eq!(requests_for(Some(10_000.0), 2.0, 64), 20_000);
    }
}
