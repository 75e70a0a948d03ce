//! SLOWLOG and LATENCY: the commands of this node that took longer than
//! `slowlog-log-slower-than` (µs) or `latency-monitor-threshold` (ms), as Redis keeps them
//! (docs/resp.md, "Slow log and latency monitor"). The time is the server's: from the
//! command's parse to its reply, including the replication round trips a write waits for.
//! Nothing is locked unless a command was slow.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;

use bytes::Bytes;

use crate::live::Live;
use crate::resp::Reply;

/// Redis keeps 32 arguments of a logged command, 128 bytes of each.
const ARGS_MAX: usize = 32;
const ARG_BYTES_MAX: usize = 128;
/// LATENCY HISTORY keeps 160 samples per event, one per second.
const SAMPLES_MAX: usize = 160;

struct SlowEntry {
    id: u64,
    time_s: u64,
    duration_us: u64,
    args: Vec<Bytes>,
    addr: String,
    name: Bytes,
}

#[derive(Default)]
struct Event {
    /// `(time_s, latency_ms)`, oldest first; one per second (the worst of that second).
    samples: VecDeque<(u64, u64)>,
    max_ms: u64,
}

#[derive(Default)]
struct State {
    next_id: u64,
    /// Newest first, as SLOWLOG GET answers.
    slow: VecDeque<SlowEntry>,
    events: BTreeMap<&'static str, Event>,
}

#[derive(Default)]
pub struct Monitor {
    state: Mutex<State>,
}

/// The command that just ran, for [`Monitor::observe`].
pub struct Ran<'a> {
    pub name: &'a str,
    pub args: &'a [Bytes],
    pub duration_us: u64,
    pub addr: String,
    pub client_name: Option<Bytes>,
}

impl Monitor {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether a command that took `duration_us` goes into either log (cheap: two loads).
    pub fn is_slow(live: &Live, duration_us: u64) -> bool {
        let slower_than_us = live.slowlog_slower_than_us.load(Relaxed);
        let threshold_ms = live.latency_threshold_ms.load(Relaxed);
        (slower_than_us >= 0 && duration_us >= slower_than_us as u64)
            || (threshold_ms > 0 && duration_us >= threshold_ms * 1000)
    }

    pub fn observe(&self, live: &Live, ran: Ran) {
        let now_s = crate::command::wall_clock_ms() / 1000;
        let slower_than_us = live.slowlog_slower_than_us.load(Relaxed);
        let len_max = live.slowlog_len_max.load(Relaxed) as usize;
        let threshold_ms = live.latency_threshold_ms.load(Relaxed);
        let mut state = self.lock();
        if slower_than_us >= 0 && ran.duration_us >= slower_than_us as u64 && len_max > 0 {
            let id = state.next_id;
            state.next_id += 1;
            state.slow.push_front(SlowEntry {
                id,
                time_s: now_s,
                duration_us: ran.duration_us,
                args: truncated(ran.args),
                addr: ran.addr,
                name: ran.client_name.unwrap_or_default(),
            });
        }
        state.slow.truncate(len_max);
        let duration_ms = ran.duration_us / 1000;
        if threshold_ms > 0 && duration_ms >= threshold_ms {
            let kind = if crate::command::has_flag(ran.name, "fast") { "fast-command" } else { "command" };
            let event = state.events.entry(kind).or_default();
            event.max_ms = event.max_ms.max(duration_ms);
            match event.samples.back_mut() {
                Some((time_s, worst_ms)) if *time_s == now_s => *worst_ms = (*worst_ms).max(duration_ms),
                _ => event.samples.push_back((now_s, duration_ms)),
            }
            if event.samples.len() > SAMPLES_MAX {
                event.samples.pop_front();
            }
        }
    }

    /// SLOWLOG GET/LEN/RESET/HELP.
    pub fn slowlog(&self, args: &[Bytes]) -> Reply {
        let sub =
            args.get(1).map(|arg| String::from_utf8_lossy(arg).to_ascii_uppercase()).unwrap_or_default();
        let mut state = self.lock();
        match (sub.as_str(), args.len()) {
            ("GET", 2 | 3) => {
                let count = match args.get(2).map(|arg| chorus_core::data::parse_int(arg)) {
                    None => 10,
                    Some(Ok(-1)) => usize::MAX,
                    Some(Ok(count)) if count >= 0 => count as usize,
                    Some(_) => return Reply::err("count should be greater than or equal to -1"),
                };
                Reply::Array(state.slow.iter().take(count).map(entry_reply).collect())
            }
            ("LEN", 2) => Reply::Integer(state.slow.len() as i64),
            ("RESET", 2) => {
                state.slow.clear();
                Reply::ok()
            }
            ("HELP", 2) => help(&["SLOWLOG GET [<count>]", "SLOWLOG LEN", "SLOWLOG RESET"]),
            _ => Reply::err(format!(
                "unknown subcommand or wrong number of arguments for '{sub}'. Try SLOWLOG HELP."
            )),
        }
    }

    /// LATENCY LATEST/HISTORY/RESET/DOCTOR/HELP.
    pub fn latency(&self, args: &[Bytes]) -> Reply {
        let sub =
            args.get(1).map(|arg| String::from_utf8_lossy(arg).to_ascii_uppercase()).unwrap_or_default();
        let mut state = self.lock();
        match (sub.as_str(), args.len()) {
            ("LATEST", 2) => Reply::Array(
                state
                    .events
                    .iter()
                    .filter_map(|(name, event)| {
                        let (time_s, latest_ms) = *event.samples.back()?;
                        Some(Reply::Array(vec![
                            Reply::text(name),
                            Reply::Integer(time_s as i64),
                            Reply::Integer(latest_ms as i64),
                            Reply::Integer(event.max_ms as i64),
                        ]))
                    })
                    .collect(),
            ),
            ("HISTORY", 3) => {
                let name = String::from_utf8_lossy(&args[2]);
                let samples = state.events.get(name.as_ref()).map(|event| &event.samples);
                Reply::Array(
                    samples
                        .into_iter()
                        .flatten()
                        .map(|(time_s, ms)| {
                            Reply::Array(vec![Reply::Integer(*time_s as i64), Reply::Integer(*ms as i64)])
                        })
                        .collect(),
                )
            }
            ("RESET", _) => {
                let before = state.events.len();
                if args.len() == 2 {
                    state.events.clear();
                } else {
                    let names: Vec<String> =
                        args[2..].iter().map(|arg| String::from_utf8_lossy(arg).into_owned()).collect();
                    state.events.retain(|name, _| !names.iter().any(|wanted| wanted == name));
                }
                Reply::Integer((before - state.events.len()) as i64)
            }
            ("DOCTOR", 2) => Reply::Verbatim(doctor(&state.events)),
            ("HELP", 2) => help(&[
                "LATENCY LATEST",
                "LATENCY HISTORY <event>",
                "LATENCY RESET [<event> ...]",
                "LATENCY DOCTOR",
            ]),
            _ => Reply::err(format!(
                "unknown subcommand or wrong number of arguments for '{sub}'. Try LATENCY HELP."
            )),
        }
    }
}

fn help(lines: &[&str]) -> Reply {
    Reply::Array(lines.iter().map(|line| Reply::text(line)).collect())
}

fn doctor(events: &BTreeMap<&'static str, Event>) -> String {
    if events.is_empty() {
        return "No latency events were recorded (latency-monitor-threshold is 0, or no command took that long). \
                Per-command histograms are on the metrics port (docs/operations.md).\n"
            .into();
    }
    events
        .iter()
        .map(|(name, event)| {
            format!(
                "{name}: {} samples, worst {} ms; the histograms on the metrics port say which commands\n",
                event.samples.len(),
                event.max_ms
            )
        })
        .collect()
}

/// `[id, time, duration µs, [args], "addr", "name"]`, as Redis answers SLOWLOG GET.
fn entry_reply(entry: &SlowEntry) -> Reply {
    Reply::Array(vec![
        Reply::Integer(entry.id as i64),
        Reply::Integer(entry.time_s as i64),
        Reply::Integer(entry.duration_us as i64),
        Reply::Array(entry.args.iter().cloned().map(Reply::Bulk).collect()),
        Reply::text(&entry.addr),
        Reply::Bulk(entry.name.clone()),
    ])
}

/// Redis' truncation: 32 arguments at most (the last saying how many more), 128 bytes of each.
fn truncated(args: &[Bytes]) -> Vec<Bytes> {
    let kept = if args.len() > ARGS_MAX { ARGS_MAX - 1 } else { args.len() };
    let mut out: Vec<Bytes> = args[..kept]
        .iter()
        .map(|arg| match arg.len().checked_sub(ARG_BYTES_MAX) {
            Some(more) if more > 0 => {
                let mut cut = arg[..ARG_BYTES_MAX].to_vec();
                cut.extend_from_slice(format!("... ({more} more bytes)").as_bytes());
                Bytes::from(cut)
            }
            _ => arg.clone(),
        })
        .collect();
    if args.len() > ARGS_MAX {
        out.push(Bytes::from(format!("... ({} more arguments)", args.len() - kept)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ClientLimits;

    fn ran<'a>(name: &'a str, args: &'a [Bytes], duration_us: u64) -> Ran<'a> {
        Ran { name, args, duration_us, addr: "127.0.0.1:1".into(), client_name: None }
    }

    fn lengths(reply: Reply) -> usize {
        match reply {
            Reply::Array(entries) => entries.len(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_slow_log_keeps_what_crossed_the_threshold_newest_first_bounded() {
        let live = Live::new(None, false, 1, 1, &ClientLimits::default());
        live.set(&[
            ("slowlog-log-slower-than".into(), b"100".to_vec()),
            ("slowlog-max-len".into(), b"2".to_vec()),
        ])
        .unwrap();
        let monitor = Monitor::default();
        let args = [Bytes::from_static(b"GET"), Bytes::from_static(b"k")];
        assert!(!Monitor::is_slow(&live, 99) && Monitor::is_slow(&live, 100));
        for duration_us in [100, 99, 200, 300] {
            if Monitor::is_slow(&live, duration_us) {
                monitor.observe(&live, ran("get", &args, duration_us));
            }
        }
        let get = |extra: &[&str]| {
            let mut args = vec![Bytes::from_static(b"SLOWLOG"), Bytes::from_static(b"GET")];
            args.extend(extra.iter().map(|arg| Bytes::copy_from_slice(arg.as_bytes())));
            monitor.slowlog(&args)
        };
        let Reply::Array(entries) = get(&[]) else { panic!() };
        let Reply::Array(newest) = &entries[0] else { panic!() };
        assert_eq!((&newest[0], &newest[2]), (&Reply::Integer(2), &Reply::Integer(300)));
        assert_eq!(entries.len(), 2, "slowlog-max-len");
        assert_eq!(lengths(get(&["1"])), 1);
        assert!(get(&["-2"]).is_error());
        monitor.slowlog(&[Bytes::from_static(b"SLOWLOG"), Bytes::from_static(b"RESET")]);
        assert_eq!(lengths(get(&[])), 0);
    }

    #[test]
    fn latency_events_need_the_threshold() {
        let live = Live::new(None, false, 1, 1, &ClientLimits::default());
        live.set(&[("slowlog-log-slower-than".into(), b"-1".to_vec())]).unwrap();
        let monitor = Monitor::default();
        let latest = || monitor.latency(&[Bytes::from_static(b"LATENCY"), Bytes::from_static(b"LATEST")]);
        assert!(!Monitor::is_slow(&live, 1_000_000), "both off");
        live.set(&[("latency-monitor-threshold".into(), b"5".to_vec())]).unwrap();
        monitor.observe(&live, ran("set", &[], 7_000));
        monitor.observe(&live, ran("set", &[], 6_000));
        let Reply::Array(events) = latest() else { panic!() };
        let Reply::Array(event) = &events[0] else { panic!() };
        assert_eq!(event[0], Reply::text("command"));
        assert_eq!(event[3], Reply::Integer(7), "max");
        let reset = monitor.latency(&[Bytes::from_static(b"LATENCY"), Bytes::from_static(b"RESET")]);
        assert_eq!(reset, Reply::Integer(1));
        assert_eq!(lengths(latest()), 0);
    }

    #[test]
    fn long_commands_are_cut_like_redis() {
        let args: Vec<Bytes> = (0..40).map(|i| Bytes::from(format!("{i}"))).collect();
        let cut = truncated(&args);
        assert_eq!(cut.len(), 32);
        assert_eq!(cut[31], Bytes::from_static(b"... (9 more arguments)"));
        let long = truncated(&[Bytes::from(vec![b'x'; 130])]);
        assert!(long[0].ends_with(b"... (2 more bytes)") && long[0].len() == 128 + 18);
    }
}
