//! RESP2 / RESP3: parsing client commands and encoding replies.
//!
//! Clients send commands as arrays of bulk strings (`*2\r\n$3\r\nGET\r\n$1\r\nk\r\n`) or as
//! inline text (`GET k\r\n`, what a human types into telnet). The parser never trusts a length
//! before bounding it, never panics, consumes nothing from an incomplete command, and reports
//! malformed input as a [`ProtocolError`]: the connection answers `-ERR Protocol error: ...`
//! and closes.

use bytes::{BufMut, Bytes, BytesMut};

/// Bounds on what one command may claim.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest bulk string (key or value) accepted. Redis' `proto-max-bulk-len`.
    pub bulk_bytes_max: usize,
    /// Most arguments in one command.
    pub args_max: usize,
    /// Longest inline command line.
    pub inline_bytes_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { bulk_bytes_max: 64 * 1024 * 1024, args_max: 1024 * 1024, inline_bytes_max: 64 * 1024 }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("Protocol error: {0}")]
pub struct ProtocolError(pub String);

/// Header lines (`*<n>`, `$<n>`) longer than this are malformed.
const HEADER_BYTES_MAX: usize = 32;

/// Take one command off the front of `buf`. `Ok(None)`: more bytes are needed and nothing was
/// consumed. `Ok(Some(args))` with empty `args` is an empty command (a blank inline line or
/// `*0`), which Redis ignores.
pub fn parse_command(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Vec<Bytes>>, ProtocolError> {
    if buf.is_empty() {
        return Ok(None);
    }
    if buf[0] == b'*' {
        parse_multibulk(buf, limits)
    } else {
        parse_inline(buf, limits)
    }
}

/// Find `\r\n` at or after `from`; `Ok(None)` when it may still arrive.
fn find_crlf(buf: &[u8], from: usize, line_bytes_max: usize) -> Result<Option<usize>, ProtocolError> {
    let window_end = buf.len().min(from.saturating_add(line_bytes_max + 2));
    match buf.get(from..window_end).and_then(|window| window.windows(2).position(|pair| pair == b"\r\n")) {
        Some(offset) => Ok(Some(from + offset)),
        None if buf.len() - from > line_bytes_max + 1 => Err(ProtocolError("header line too long".into())),
        None => Ok(None),
    }
}

fn parse_length(digits: &[u8], what: &str) -> Result<i64, ProtocolError> {
    let invalid = || ProtocolError(format!("invalid {what} length"));
    let text = std::str::from_utf8(digits).map_err(|_| invalid())?;
    if text.is_empty() || text.starts_with('+') {
        return Err(invalid());
    }
    text.parse::<i64>().map_err(|_| invalid())
}

fn parse_multibulk(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Vec<Bytes>>, ProtocolError> {
    let Some(end) = find_crlf(buf, 1, HEADER_BYTES_MAX)? else { return Ok(None) };
    let count = parse_length(&buf[1..end], "multibulk")?;
    let mut pos = end + 2;
    if count <= 0 {
        // `*0` and `*-1` are empty commands.
        let _ = buf.split_to(pos);
        return Ok(Some(Vec::new()));
    }
    if count as u64 > limits.args_max as u64 {
        return Err(ProtocolError(format!(
            "invalid multibulk length {count} (the limit is {})",
            limits.args_max
        )));
    }
    let count = count as usize;
    // Where each argument lies; `count` is bounded, but only reserve what the buffer can hold.
    let mut spans = Vec::with_capacity(count.min(buf.len() / 4 + 1));
    for _ in 0..count {
        let Some(&marker) = buf.get(pos) else { return Ok(None) };
        if marker != b'$' {
            return Err(ProtocolError(format!(
                "expected '$', got '{}'",
                char::from(marker).escape_default()
            )));
        }
        let Some(end) = find_crlf(buf, pos + 1, HEADER_BYTES_MAX)? else { return Ok(None) };
        let length = parse_length(&buf[pos + 1..end], "bulk")?;
        if length < 0 {
            return Err(ProtocolError("invalid bulk length".into()));
        }
        if length as u64 > limits.bulk_bytes_max as u64 {
            return Err(ProtocolError(format!(
                "bulk length {length} exceeds the limit of {} bytes",
                limits.bulk_bytes_max
            )));
        }
        let start = end + 2;
        let stop = start + length as usize;
        if buf.len() < stop + 2 {
            // Make room for the rest of a large value once, not by repeated doubling.
            buf.reserve(stop + 2 - buf.len());
            return Ok(None);
        }
        if &buf[stop..stop + 2] != b"\r\n" {
            return Err(ProtocolError("bulk string not terminated by CRLF".into()));
        }
        spans.push((start, stop));
        pos = stop + 2;
    }
    let frame = buf.split_to(pos).freeze();
    Ok(Some(spans.into_iter().map(|(start, stop)| frame.slice(start..stop)).collect()))
}

fn parse_inline(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Vec<Bytes>>, ProtocolError> {
    let Some(newline) = buf.iter().take(limits.inline_bytes_max + 1).position(|byte| *byte == b'\n') else {
        if buf.len() > limits.inline_bytes_max {
            return Err(ProtocolError("too big inline request".into()));
        }
        return Ok(None);
    };
    let line = buf.split_to(newline + 1).freeze();
    let text = line.slice(..newline);
    let text = text.strip_suffix(b"\r").unwrap_or(&text);
    let mut args = Vec::new();
    for word in text.split(|byte| byte.is_ascii_whitespace()).filter(|word| !word.is_empty()) {
        if word.contains(&b'"') || word.contains(&b'\'') {
            return Err(ProtocolError("quotes in inline commands are not supported; use RESP arrays".into()));
        }
        args.push(Bytes::copy_from_slice(word));
    }
    if args.len() > limits.args_max {
        return Err(ProtocolError("too many arguments".into()));
    }
    Ok(Some(args))
}

/// A reply, encoded for the connection's protocol version.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// `+OK`
    Status(&'static str),
    /// A whole error line without the leading `-`, e.g. `ERR syntax error`.
    Error(String),
    Integer(i64),
    Bulk(Bytes),
    /// RESP2 `$-1`, RESP3 `_`.
    Null,
    /// RESP2 `*-1`, RESP3 `_`.
    NullArray,
    Array(Vec<Reply>),
    /// RESP3 `%` map; a flat array of alternating keys and values in RESP2.
    Map(Vec<(Reply, Reply)>),
    /// RESP3 `=` verbatim text (`txt`); a bulk string in RESP2. INFO answers with it.
    Verbatim(String),
}

impl Reply {
    pub fn ok() -> Reply {
        Reply::Status("OK")
    }

    pub fn error(message: impl Into<String>) -> Reply {
        Reply::Error(message.into())
    }

    /// `-ERR <message>`
    pub fn err(message: impl std::fmt::Display) -> Reply {
        Reply::Error(format!("ERR {message}"))
    }

    pub fn bulk(bytes: impl Into<Bytes>) -> Reply {
        Reply::Bulk(bytes.into())
    }

    pub fn text(text: &str) -> Reply {
        Reply::Bulk(Bytes::copy_from_slice(text.as_bytes()))
    }

    pub fn optional(value: Option<Bytes>) -> Reply {
        value.map_or(Reply::Null, Reply::Bulk)
    }

    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }

    /// Append the encoding for protocol version `resp` (2 or 3).
    pub fn encode(&self, resp: u8, out: &mut BytesMut) {
        match self {
            Reply::Status(text) => line(out, b'+', text.as_bytes()),
            Reply::Error(text) => {
                // An error line cannot contain CR or LF.
                let clean: String =
                    text.chars().map(|c| if c == '\r' || c == '\n' { ' ' } else { c }).collect();
                line(out, b'-', clean.as_bytes());
            }
            Reply::Integer(value) => line(out, b':', value.to_string().as_bytes()),
            Reply::Bulk(bytes) => {
                line(out, b'$', bytes.len().to_string().as_bytes());
                out.put_slice(bytes);
                out.put_slice(b"\r\n");
            }
            Reply::Null if resp >= 3 => out.put_slice(b"_\r\n"),
            Reply::Null => out.put_slice(b"$-1\r\n"),
            Reply::NullArray if resp >= 3 => out.put_slice(b"_\r\n"),
            Reply::NullArray => out.put_slice(b"*-1\r\n"),
            Reply::Array(items) => {
                line(out, b'*', items.len().to_string().as_bytes());
                for item in items {
                    item.encode(resp, out);
                }
            }
            Reply::Map(pairs) => {
                if resp >= 3 {
                    line(out, b'%', pairs.len().to_string().as_bytes());
                } else {
                    line(out, b'*', (pairs.len() * 2).to_string().as_bytes());
                }
                for (key, value) in pairs {
                    key.encode(resp, out);
                    value.encode(resp, out);
                }
            }
            Reply::Verbatim(text) if resp >= 3 => {
                line(out, b'=', (text.len() + 4).to_string().as_bytes());
                out.put_slice(b"txt:");
                out.put_slice(text.as_bytes());
                out.put_slice(b"\r\n");
            }
            Reply::Verbatim(text) => Reply::text(text).encode(resp, out),
        }
    }
}

fn line(out: &mut BytesMut, marker: u8, body: &[u8]) {
    out.put_u8(marker);
    out.put_slice(body);
    out.put_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse_all(input: &[u8]) -> Result<Vec<Vec<Bytes>>, ProtocolError> {
        let mut buf = BytesMut::from(input);
        let mut commands = Vec::new();
        while let Some(args) = parse_command(&mut buf, &Limits::default())? {
            commands.push(args);
        }
        Ok(commands)
    }

    fn words(args: &[Bytes]) -> Vec<&str> {
        args.iter().map(|arg| std::str::from_utf8(arg).unwrap()).collect()
    }

    #[test]
    fn parses_pipelined_arrays_and_inline_commands() {
        let commands = parse_all(
            b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\nPING\r\n  ECHO   hi \n",
        )
        .unwrap();
        assert_eq!(commands.len(), 4);
        assert_eq!(words(&commands[0]), ["GET", "k"]);
        assert_eq!(words(&commands[1]), ["SET", "k", ""]);
        assert_eq!(words(&commands[2]), ["PING"]);
        assert_eq!(words(&commands[3]), ["ECHO", "hi"]);
    }

    #[test]
    fn binary_values_survive() {
        let commands = parse_all(b"*2\r\n$4\r\nECHO\r\n$4\r\n\r\n\x00\xff\r\n").unwrap();
        assert_eq!(commands[0][1].as_ref(), b"\r\n\x00\xff");
    }

    #[test]
    fn incomplete_commands_consume_nothing() {
        let full = b"*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$5\r\nvalue\r\n";
        for cut in 0..full.len() {
            let mut buf = BytesMut::from(&full[..cut]);
            assert_eq!(parse_command(&mut buf, &Limits::default()), Ok(None), "cut at {cut}");
            assert_eq!(buf.len(), cut);
        }
        let mut buf = BytesMut::from(&full[..]);
        assert!(parse_command(&mut buf, &Limits::default()).unwrap().is_some());
        assert!(buf.is_empty());
    }

    #[test]
    fn malformed_input_is_an_error() {
        for bad in [
            &b"*x\r\n"[..],
            b"*2\r\n+GET\r\n",
            b"*1\r\n$-5\r\n",
            b"*1\r\n$3\r\nGETX\r\n",
            b"*1\r\n$abc\r\n",
            b"*99999999999999999999\r\n",
            b"*1\r\n$1111111111111111111111111111111111111111111\r\n",
            b"*1\r\n$+3\r\nGET\r\n",
            b"SET k \"v\"\r\n",
        ] {
            assert!(parse_all(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn limits_are_enforced_before_buffering() {
        let limits = Limits { bulk_bytes_max: 10, args_max: 3, inline_bytes_max: 16 };
        let mut big_value = BytesMut::from(&b"*2\r\n$3\r\nGET\r\n$11\r\n"[..]);
        let error = parse_command(&mut big_value, &limits).unwrap_err();
        assert!(error.0.contains("exceeds the limit"), "{error}");
        let mut many = BytesMut::from(&b"*4\r\n"[..]);
        assert!(parse_command(&mut many, &limits).is_err());
        let mut long_inline = BytesMut::from(&[b'a'; 40][..]);
        assert!(parse_command(&mut long_inline, &limits).is_err());
        let mut endless_header = BytesMut::from(&b"*1111111111111111111111111111111111111111111"[..]);
        assert!(parse_command(&mut endless_header, &limits).is_err());
    }

    #[test]
    fn empty_commands_are_skipped_not_errors() {
        assert_eq!(parse_all(b"\r\n*0\r\n*-1\r\n").unwrap(), vec![Vec::<Bytes>::new(); 3]);
    }

    fn encoded(reply: Reply, resp: u8) -> String {
        let mut out = BytesMut::new();
        reply.encode(resp, &mut out);
        String::from_utf8(out.to_vec()).unwrap()
    }

    #[test]
    fn replies_encode_for_resp2_and_resp3() {
        assert_eq!(encoded(Reply::ok(), 2), "+OK\r\n");
        assert_eq!(encoded(Reply::err("bad\r\nthing"), 2), "-ERR bad  thing\r\n");
        assert_eq!(encoded(Reply::Integer(-3), 2), ":-3\r\n");
        assert_eq!(encoded(Reply::text("v"), 2), "$1\r\nv\r\n");
        assert_eq!(encoded(Reply::Null, 2), "$-1\r\n");
        assert_eq!(encoded(Reply::Null, 3), "_\r\n");
        assert_eq!(encoded(Reply::NullArray, 2), "*-1\r\n");
        let map = Reply::Map(vec![(Reply::text("a"), Reply::Integer(1))]);
        assert_eq!(encoded(map.clone(), 2), "*2\r\n$1\r\na\r\n:1\r\n");
        assert_eq!(encoded(map, 3), "%1\r\n$1\r\na\r\n:1\r\n");
        assert_eq!(encoded(Reply::Verbatim("x:1".into()), 3), "=7\r\ntxt:x:1\r\n");
        assert_eq!(encoded(Reply::Verbatim("x:1".into()), 2), "$3\r\nx:1\r\n");
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(junk in proptest::collection::vec(any::<u8>(), 0..512)) {
            let limits = Limits { bulk_bytes_max: 1024, args_max: 64, inline_bytes_max: 256 };
            let mut buf = BytesMut::from(&junk[..]);
            // Keep parsing until the parser wants more bytes or reports an error; each step
            // must consume something, so this terminates.
            while let Ok(Some(_)) = parse_command(&mut buf, &limits) {}
        }

        #[test]
        fn arbitrary_bytes_after_a_valid_prefix_never_panic(
            junk in proptest::collection::vec(any::<u8>(), 0..128),
            count in 0usize..4,
        ) {
            let mut input = format!("*{}\r\n$3\r\nSET\r\n", count + 1).into_bytes();
            input.extend_from_slice(&junk);
            let mut buf = BytesMut::from(&input[..]);
            while let Ok(Some(_)) = parse_command(&mut buf, &Limits::default()) {}
        }

        #[test]
        fn any_command_round_trips(args in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 1..8)) {
            let mut input = BytesMut::new();
            input.put_slice(format!("*{}\r\n", args.len()).as_bytes());
            for arg in &args {
                input.put_slice(format!("${}\r\n", arg.len()).as_bytes());
                input.put_slice(arg);
                input.put_slice(b"\r\n");
            }
            let parsed = parse_command(&mut input, &Limits::default()).unwrap().unwrap();
            prop_assert!(input.is_empty());
            prop_assert_eq!(parsed.iter().map(|a| a.to_vec()).collect::<Vec<_>>(), args);
        }
    }
}
