//! Counters for INFO and the Prometheus text endpoint (`--metrics-addr`, off by default).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use chorus_net::{Histogram, NetStats};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tracing::{debug, warn};

use crate::command::COMMAND_NAMES;
use crate::engine::{EngineHandle, EngineStatus};

/// Command latency buckets, microseconds.
const LATENCY_US_BOUNDS: &[u64] =
    &[50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000];

pub struct CommandMetrics {
    pub calls: AtomicU64,
    pub errors: AtomicU64,
    pub latency_us: Histogram,
}

/// Node-wide counters. Commands are indexed by their position in [`COMMAND_NAMES`].
pub struct Metrics {
    pub started: Instant,
    pub commands: Vec<CommandMetrics>,
    pub connections_accepted: AtomicU64,
    pub connections_current: AtomicU64,
    pub connections_rejected: AtomicU64,
    pub protocol_errors: AtomicU64,
    /// The allocator's bytes in use, sampled (memory.rs) while `maxmemory` is set.
    pub used_memory: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            started: Instant::now(),
            commands: COMMAND_NAMES
                .iter()
                .map(|_| CommandMetrics {
                    calls: AtomicU64::new(0),
                    errors: AtomicU64::new(0),
                    latency_us: Histogram::new(LATENCY_US_BOUNDS),
                })
                .collect(),
            connections_accepted: AtomicU64::new(0),
            connections_current: AtomicU64::new(0),
            connections_rejected: AtomicU64::new(0),
            protocol_errors: AtomicU64::new(0),
            used_memory: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    /// Count a command that started at `started`; how long it took, µs.
    pub fn record(&self, command: usize, error: bool, started: Instant) -> u64 {
        let duration_us = started.elapsed().as_micros() as u64;
        if let Some(metrics) = self.commands.get(command) {
            metrics.calls.fetch_add(1, Relaxed);
            if error {
                metrics.errors.fetch_add(1, Relaxed);
            }
            metrics.latency_us.observe(duration_us);
        }
        duration_us
    }

    /// CONFIG RESETSTAT: zero the counters INFO shows (commands, errors, connections
    /// received and rejected, protocol errors). Prometheus sees a counter reset, as after a
    /// restart; the latency histograms and the clients connected now are kept.
    pub fn reset_stats(&self) {
        for command in &self.commands {
            command.calls.store(0, Relaxed);
            command.errors.store(0, Relaxed);
        }
        self.connections_accepted.store(0, Relaxed);
        self.connections_rejected.store(0, Relaxed);
        self.protocol_errors.store(0, Relaxed);
    }

    pub fn total_commands(&self) -> u64 {
        self.commands.iter().map(|c| c.calls.load(Relaxed)).sum()
    }

    pub fn total_errors(&self) -> u64 {
        self.commands.iter().map(|c| c.errors.load(Relaxed)).sum()
    }

    /// The Prometheus text exposition.
    pub fn render(&self, status: Option<&EngineStatus>, net: &NetStats) -> String {
        let mut out = String::new();
        let w = &mut out;
        let _ = writeln!(w, "# HELP chorus_commands_total Commands executed, by command.");
        let _ = writeln!(w, "# TYPE chorus_commands_total counter");
        for (name, metrics) in COMMAND_NAMES.iter().zip(&self.commands) {
            let calls = metrics.calls.load(Relaxed);
            if calls > 0 {
                let _ = writeln!(w, "chorus_commands_total{{command=\"{name}\"}} {calls}");
            }
        }
        let _ =
            writeln!(w, "# HELP chorus_command_errors_total Commands answered with an error, by command.");
        let _ = writeln!(w, "# TYPE chorus_command_errors_total counter");
        for (name, metrics) in COMMAND_NAMES.iter().zip(&self.commands) {
            let errors = metrics.errors.load(Relaxed);
            if errors > 0 {
                let _ = writeln!(w, "chorus_command_errors_total{{command=\"{name}\"}} {errors}");
            }
        }
        let _ = writeln!(w, "# HELP chorus_command_latency_seconds Command latency as the server sees it.");
        let _ = writeln!(w, "# TYPE chorus_command_latency_seconds histogram");
        for (name, metrics) in COMMAND_NAMES.iter().zip(&self.commands) {
            if metrics.calls.load(Relaxed) == 0 {
                continue;
            }
            let (cumulative, sum_us) = metrics.latency_us.snapshot();
            for (bound, count) in metrics.latency_us.bounds().iter().zip(&cumulative) {
                let le = *bound as f64 / 1e6;
                let _ = writeln!(
                    w,
                    "chorus_command_latency_seconds_bucket{{command=\"{name}\",le=\"{le}\"}} {count}"
                );
            }
            let total = cumulative.last().copied().unwrap_or(0);
            let _ = writeln!(
                w,
                "chorus_command_latency_seconds_bucket{{command=\"{name}\",le=\"+Inf\"}} {total}"
            );
            let _ = writeln!(
                w,
                "chorus_command_latency_seconds_sum{{command=\"{name}\"}} {}",
                sum_us as f64 / 1e6
            );
            let _ = writeln!(w, "chorus_command_latency_seconds_count{{command=\"{name}\"}} {total}");
        }
        gauge(
            w,
            "chorus_connected_clients",
            "Client connections open.",
            self.connections_current.load(Relaxed),
        );
        counter(
            w,
            "chorus_connections_total",
            "Client connections accepted.",
            self.connections_accepted.load(Relaxed),
        );
        counter(
            w,
            "chorus_protocol_errors_total",
            "Client connections closed for malformed RESP.",
            self.protocol_errors.load(Relaxed),
        );
        if let Some(status) = status {
            gauge(w, "chorus_view_epoch", "The current membership epoch.", status.view.epoch.0);
            gauge(
                w,
                "chorus_view_live_replicas",
                "Replicas live in the current view.",
                status.view.live.len() as u64,
            );
            gauge(w, "chorus_operational", "1 if this replica serves clients.", status.operational as u64);
            gauge(w, "chorus_keys", "Keys holding a value at this replica.", status.keys as u64);
            gauge(
                w,
                "chorus_requests_in_flight",
                "Client requests inside the protocol core.",
                status.pending_requests as u64,
            );
            for (name, value) in &status.counters {
                counter(
                    w,
                    &format!("chorus_{}_{name}_total", status.protocol),
                    "Protocol core counter.",
                    *value,
                );
            }
        }
        peer_metrics(w, net);
        out
    }
}

fn gauge(w: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(w, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
}

fn counter(w: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(w, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
}

/// One per-peer series: name, type, help, and how to read it from a snapshot.
type PeerSeries = (&'static str, &'static str, &'static str, fn(&chorus_net::PeerStatsSnapshot) -> u64);

fn peer_metrics(w: &mut String, net: &NetStats) {
    let series: [PeerSeries; 9] = [
        ("chorus_peer_connected", "gauge", "1 if the link to the peer is up.", |p| p.connected as u64),
        ("chorus_peer_queue_bytes", "gauge", "Bytes queued for the peer (credits in use).", |p| {
            p.queued_bytes
        }),
        ("chorus_peer_queue_frames", "gauge", "Frames queued for the peer.", |p| p.queued_frames),
        ("chorus_peer_frames_sent_total", "counter", "Batch frames written to the peer.", |p| p.frames_sent),
        ("chorus_peer_messages_sent_total", "counter", "Protocol messages written to the peer.", |p| {
            p.messages_sent
        }),
        ("chorus_peer_bytes_sent_total", "counter", "Bytes written to the peer.", |p| p.bytes_sent),
        ("chorus_peer_frames_dropped_total", "counter", "Frames dropped: no credits or link down.", |p| {
            p.frames_dropped
        }),
        (
            "chorus_peer_messages_received_total",
            "counter",
            "Protocol messages received from the peer.",
            |p| p.messages_received,
        ),
        ("chorus_peer_reconnects_total", "counter", "Successful (re)connections to the peer.", |p| {
            p.connects
        }),
    ];
    let snapshots: Vec<_> = net.peers.values().map(|peer| peer.snapshot()).collect();
    for (name, kind, help, get) in series {
        let _ = writeln!(w, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for peer in &snapshots {
            let _ = writeln!(w, "{name}{{peer=\"{}\"}} {}", peer.node, get(peer));
        }
    }
    let name = "chorus_peer_batch_messages";
    let _ = writeln!(
        w,
        "# HELP {name} Messages per batch frame (opportunistic batching).\n# TYPE {name} histogram"
    );
    for peer in net.peers.values() {
        let (cumulative, sum) = peer.batch_messages.snapshot();
        for (bound, count) in peer.batch_messages.bounds().iter().zip(&cumulative) {
            let _ = writeln!(w, "{name}_bucket{{peer=\"{}\",le=\"{bound}\"}} {count}", peer.node);
        }
        let total = cumulative.last().copied().unwrap_or(0);
        let _ = writeln!(w, "{name}_bucket{{peer=\"{}\",le=\"+Inf\"}} {total}", peer.node);
        let _ = writeln!(w, "{name}_sum{{peer=\"{}\"}} {sum}", peer.node);
        let _ = writeln!(w, "{name}_count{{peer=\"{}\"}} {total}", peer.node);
    }
}

/// Scrapes served at once; more connections are closed at once, so a flood of them on the
/// metrics port cannot use up the node's descriptors.
const SCRAPES_CONCURRENT_MAX: usize = 16;

/// Serve `GET /metrics` (any path, really) as Prometheus text until the runtime stops.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, net: Arc<NetStats>, engine: EngineHandle) {
    let slots = Arc::new(tokio::sync::Semaphore::new(SCRAPES_CONCURRENT_MAX));
    loop {
        let (mut stream, remote) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                warn!("metrics endpoint: accept failed: {error}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            debug!(%remote, "metrics endpoint busy: connection closed");
            continue;
        };
        let (metrics, net, engine) = (metrics.clone(), net.clone(), engine.clone());
        tokio::spawn(async move {
            let _slot = slot;
            // Read the request head (bounded), ignore its content, answer, close.
            let mut head = Vec::with_capacity(1024);
            let mut chunk = [0u8; 1024];
            let read = tokio::time::timeout(std::time::Duration::from_secs(5), async {
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return false,
                        Ok(n) => head.extend_from_slice(&chunk[..n]),
                    }
                }
                true
            })
            .await;
            if !matches!(read, Ok(true)) {
                debug!(%remote, "metrics request incomplete");
                return;
            }
            let status = engine.status().await;
            let body = metrics.render(status.as_ref(), &net);
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        });
    }
}
