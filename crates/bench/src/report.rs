//! Reports: per-operation throughput and latency percentiles, printed and as JSON.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::driver::{new_histogram, RunResult};
use crate::workload::OpKind;

/// Latency percentiles in microseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub mean_us: f64,
    pub min_us: f64,
    pub p50_us: f64,
    pub p95_us: f64,
    pub p99_us: f64,
    pub p99_9_us: f64,
    pub max_us: f64,
}

impl Latency {
    pub fn of(histogram: &Histogram<u64>) -> Latency {
        if histogram.is_empty() {
            return Latency::default();
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        Latency {
            mean_us: histogram.mean() / 1000.0,
            min_us: us(histogram.min()),
            p50_us: us(histogram.value_at_quantile(0.50)),
            p95_us: us(histogram.value_at_quantile(0.95)),
            p99_us: us(histogram.value_at_quantile(0.99)),
            p99_9_us: us(histogram.value_at_quantile(0.999)),
            max_us: us(histogram.max()),
        }
    }
}

/// One operation type (or all of them together).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OpStats {
    pub operation: String,
    /// Completed without error.
    pub count: u64,
    pub errors: u64,
    pub ops_per_s: f64,
    pub latency: Latency,
}

/// What a measurement reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub elapsed_s: f64,
    pub operations: u64,
    pub errors: u64,
    pub ops_per_s: f64,
    /// Every operation type together.
    pub overall: OpStats,
    pub by_operation: Vec<OpStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

fn stats(name: &str, histogram: &Histogram<u64>, errors: u64, elapsed: Duration) -> OpStats {
    let seconds = elapsed.as_secs_f64().max(1e-9);
    OpStats {
        operation: name.to_string(),
        count: histogram.len(),
        errors,
        ops_per_s: (histogram.len() + errors) as f64 / seconds,
        latency: Latency::of(histogram),
    }
}

impl Report {
    pub fn of(result: &RunResult) -> Report {
        let mut all = new_histogram();
        let mut by_operation = Vec::new();
        let recorder = &result.recorder;
        for kind in OpKind::ALL {
            let histogram = recorder.histograms[kind.index()].clone();
            let errors = recorder.errors[kind.index()];
            if histogram.is_none() && errors == 0 {
                continue;
            }
            let histogram = histogram.unwrap_or_else(new_histogram);
            all.add(&histogram).expect("same bounds");
            by_operation.push(stats(kind.name(), &histogram, errors, result.elapsed));
        }
        let errors: u64 = recorder.errors.iter().sum();
        let overall = stats("ALL", &all, errors, result.elapsed);
        Report {
            elapsed_s: result.elapsed.as_secs_f64(),
            operations: all.len() + errors,
            errors,
            ops_per_s: overall.ops_per_s,
            overall,
            by_operation,
            first_error: recorder.first_error.clone(),
        }
    }

    /// A YCSB-like text summary.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "[OVERALL] runtime {:.3} s, {} operations, {:.0} ops/s, {} errors\n",
            self.elapsed_s, self.operations, self.ops_per_s, self.errors
        ));
        out.push_str(&format!(
            "{:<18} {:>9} {:>7} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
            "operation", "count", "errors", "ops/s", "p50 us", "p95 us", "p99 us", "p99.9 us", "max us"
        ));
        for op in self.by_operation.iter().chain(std::iter::once(&self.overall)) {
            let l = &op.latency;
            out.push_str(&format!(
                "{:<18} {:>9} {:>7} {:>10.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}\n",
                op.operation,
                op.count,
                op.errors,
                op.ops_per_s,
                l.p50_us,
                l.p95_us,
                l.p99_us,
                l.p99_9_us,
                l.max_us
            ));
        }
        if let Some(error) = &self.first_error {
            out.push_str(&format!("first error: {error}\n"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::Recorder;

    #[test]
    fn report_json_has_every_field() {
        let mut recorder = Recorder::default();
        for i in 1..=1000u64 {
            recorder.record(OpKind::Read, i * 1000, None);
        }
        recorder.record(OpKind::Update, 5_000, None);
        recorder.record(OpKind::Update, 0, Some("boom".into()));
        let report = Report::of(&RunResult { elapsed: Duration::from_secs(2), recorder });
        assert_eq!(report.operations, 1002);
        assert_eq!(report.errors, 1);
        assert!((report.ops_per_s - 501.0).abs() < 1e-9);
        let read = &report.by_operation[0];
        assert_eq!(read.operation, "READ");
        assert!((read.latency.p50_us - 500.0).abs() <= 1.0, "{:?}", read.latency);
        assert!((read.latency.p99_us - 990.0).abs() <= 1.0, "{:?}", read.latency);
        assert!((read.latency.max_us - 1000.0).abs() <= 1.0, "{:?}", read.latency);

        let json = serde_json::to_value(&report).unwrap();
        for key in
            ["elapsed_s", "operations", "errors", "ops_per_s", "overall", "by_operation", "first_error"]
        {
            assert!(json.get(key).is_some(), "missing {key} in {json}");
        }
        let op = &json["by_operation"][1];
        assert_eq!(op["operation"], "UPDATE");
        assert_eq!(op["errors"], 1);
        for key in ["mean_us", "min_us", "p50_us", "p95_us", "p99_us", "p99_9_us", "max_us"] {
            assert!(op["latency"][key].is_number(), "missing latency.{key} in {op}");
        }
        let back: Report = serde_json::from_value(json).unwrap();
        assert_eq!(back, report);
        assert!(report.to_text().contains("READ"));
    }
}
