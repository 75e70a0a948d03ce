//! RESP2 / RESP3: parsing client commands and encoding replies.
//!
//! Clients send commands as arrays of bulk strings (`*2\r\n$3\r\nGET\r\n$1\r\nk\r\n`) or as
//! inline text (`GET k\r\n`, what a human types into telnet). The [`Parser`] keeps its place
//! between reads, so a command that arrives in many pieces is parsed in time linear in its
//! bytes; it never trusts a length before bounding it and never reserves memory from one (the
//! read buffer grows only as bytes arrive); it never panics; and it reports malformed input as
//! a [`ProtocolError`]: the connection answers `-ERR Protocol error: ...` and closes.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Bounds on what one command may claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest bulk string (key or value) accepted: the smaller of Redis'
    /// `proto-max-bulk-len` and the node's `value_bytes_max`.
    pub bulk_bytes_max: usize,
    /// Most arguments in one command.
    pub args_max: usize,
    /// Longest inline command line.
    pub inline_bytes_max: usize,
    /// Whether these are the limits for a client that has not authenticated yet (the errors
    /// then say so, as Redis' do).
    pub unauthenticated: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            bulk_bytes_max: 64 * 1024 * 1024,
            args_max: 1024 * 1024,
            inline_bytes_max: 64 * 1024,
            unauthenticated: false,
        }
    }
}

impl Limits {
    /// The error for a `what` length over a limit: Redis' terse wording before AUTH (an
    /// anonymous client learns nothing about the limits), the details after.
    fn exceeded(&self, what: &str, detail: impl FnOnce() -> String) -> ProtocolError {
        if self.unauthenticated {
            return ProtocolError(format!("unauthenticated {what} length"));
        }
        ProtocolError(detail())
    }

    /// Before AUTH, when a password is set: what Redis 7.2 allows unauthenticated clients
    /// (10 arguments, 16 KiB per bulk), enough for `AUTH` and `HELLO 3 AUTH user pw SETNAME x`.
    pub const UNAUTHENTICATED: Limits = Limits {
        bulk_bytes_max: 16 * 1024,
        args_max: 10,
        inline_bytes_max: 16 * 1024,
        unauthenticated: true,
    };
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("Protocol error: {0}")]
pub struct ProtocolError(pub String);

/// Header lines (`*<n>`, `$<n>`) longer than this are malformed.
const HEADER_BYTES_MAX: usize = 32;

/// Arguments shorter than this are copied out of the read buffer, so that a stored 5-byte
/// value does not keep the connection's whole 16 KiB (or larger) buffer allocated.
const COPY_BELOW_BYTES: usize = 16 * 1024;

/// Commands up to this size are copied out of the read buffer in one piece
/// ([`take_args`]).
const ONE_COPY_BELOW_BYTES: usize = 512;

/// Parses commands off the front of a connection's read buffer, keeping its place in an
/// incomplete command between calls: each call only looks at bytes that arrived since the
/// last one (a header cut in two is re-read, at most [`HEADER_BYTES_MAX`] bytes).
#[derive(Debug, Default)]
pub struct Parser {
    /// How far the current command has been parsed.
    pos: usize,
    /// Multibulk: the argument count, once the `*<n>` line is parsed.
    count: Option<usize>,
    /// Where each complete argument of the current command lies in the buffer.
    spans: Vec<(usize, usize)>,
    /// The bulk being received: where its bytes start and how many there are.
    bulk: Option<(usize, usize)>,
}

impl Parser {
    /// Take one command off the front of `buf`. `Ok(None)`: more bytes are needed (nothing
    /// is consumed; call again once more arrived). `Ok(Some(args))` with empty `args` is an
    /// empty command (a blank inline line or `*0`), which Redis ignores.
    pub fn parse(
        &mut self,
        buf: &mut BytesMut,
        limits: &Limits,
    ) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        if buf.is_empty() {
            debug_assert_eq!(self.pos, 0);
            return Ok(None);
        }
        let result =
            if buf[0] == b'*' { self.parse_multibulk(buf, limits) } else { self.parse_inline(buf, limits) };
        if !matches!(result, Ok(None)) {
            self.reset();
        }
        result
    }

    /// Whether part of a command has been received.
    pub fn in_progress(&self, buf: &BytesMut) -> bool {
        !buf.is_empty()
    }

    fn reset(&mut self) {
        self.pos = 0;
        self.count = None;
        self.spans.clear();
        self.bulk = None;
    }

    fn parse_multibulk(
        &mut self,
        buf: &mut BytesMut,
        limits: &Limits,
    ) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        let count = match self.count {
            Some(count) => count,
            None => {
                let Some(end) = find_crlf(buf, 1, HEADER_BYTES_MAX)? else { return Ok(None) };
                let count = parse_length(&buf[1..end], "multibulk")?;
                if count <= 0 {
                    // `*0` and `*-1` are empty commands.
                    buf.advance(end + 2);
                    return Ok(Some(Vec::new()));
                }
                if count as u64 > limits.args_max as u64 {
                    return Err(limits.exceeded("multibulk", || {
                        format!("invalid multibulk length {count} (the limit is {})", limits.args_max)
                    }));
                }
                self.pos = end + 2;
                self.count = Some(count as usize);
                count as usize
            }
        };
        while self.spans.len() < count {
            let (start, length) = match self.bulk {
                Some(bulk) => bulk,
                None => {
                    let Some(bulk) = self.parse_bulk_header(buf, limits)? else { return Ok(None) };
                    self.bulk = Some(bulk);
                    bulk
                }
            };
            let stop = start + length;
            if buf.len() < stop + 2 {
                return Ok(None); // the read buffer grows as the bytes arrive, never before
            }
            if &buf[stop..stop + 2] != b"\r\n" {
                return Err(ProtocolError("bulk string not terminated by CRLF".into()));
            }
            self.spans.push((start, stop));
            self.bulk = None;
            self.pos = stop + 2;
        }
        Ok(Some(take_args(buf, self.pos, &self.spans)))
    }

    /// The `$<n>` line at `self.pos`: where the bulk's bytes start and how many there are.
    fn parse_bulk_header(
        &self,
        buf: &BytesMut,
        limits: &Limits,
    ) -> Result<Option<(usize, usize)>, ProtocolError> {
        let Some(&marker) = buf.get(self.pos) else { return Ok(None) };
        if marker != b'$' {
            return Err(ProtocolError(format!(
                "expected '$', got '{}'",
                char::from(marker).escape_default()
            )));
        }
        let Some(end) = find_crlf(buf, self.pos + 1, HEADER_BYTES_MAX)? else { return Ok(None) };
        let length = parse_length(&buf[self.pos + 1..end], "bulk")?;
        if length < 0 {
            return Err(ProtocolError("invalid bulk length".into()));
        }
        if length as u64 > limits.bulk_bytes_max as u64 {
            return Err(limits.exceeded("bulk", || {
                format!("bulk length {length} exceeds the limit of {} bytes", limits.bulk_bytes_max)
            }));
        }
        Ok(Some((end + 2, length as usize)))
    }

    fn parse_inline(
        &mut self,
        buf: &mut BytesMut,
        limits: &Limits,
    ) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        // Resume the search for the newline where the last call stopped.
        let window_end = buf.len().min(limits.inline_bytes_max + 1);
        let Some(offset) = buf[self.pos.min(window_end)..window_end].iter().position(|byte| *byte == b'\n')
        else {
            if buf.len() > limits.inline_bytes_max {
                return Err(ProtocolError("too big inline request".into()));
            }
            self.pos = buf.len();
            return Ok(None);
        };
        let newline = self.pos.min(window_end) + offset;
        let line = &buf[..newline];
        let text = line.strip_suffix(b"\r").unwrap_or(line);
        let mut args = Vec::new();
        for word in text.split(|byte| byte.is_ascii_whitespace()).filter(|word| !word.is_empty()) {
            if word.contains(&b'"') || word.contains(&b'\'') {
                return Err(ProtocolError(
                    "quotes in inline commands are not supported; use RESP arrays".into(),
                ));
            }
            if args.len() == limits.args_max {
                return Err(limits.exceeded("multibulk", || "too many arguments".into()));
            }
            args.push(Bytes::copy_from_slice(word));
        }
        buf.advance(newline + 1);
        Ok(Some(args))
    }
}

/// Take the command's `frame_bytes` off the front of `buf` and return its arguments. Small
/// arguments are copied out; an argument shares the buffer only if it is large and fills at
/// least a quarter of it (the buffer doubles as bytes arrive), so what a stored value keeps
/// alive is at most about four times itself, never a 16 KiB buffer for 5 bytes.
fn take_args(buf: &mut BytesMut, frame_bytes: usize, spans: &[(usize, usize)]) -> Vec<Bytes> {
    let capacity = buf.capacity();
    let shares = |(start, stop): (usize, usize)| {
        let length = stop - start;
        length >= COPY_BELOW_BYTES && length * 4 >= capacity
    };
    if frame_bytes <= ONE_COPY_BELOW_BYTES {
        // A small command (a GET, a SET of a small value): one copy of the whole command and
        // its arguments slices of it, instead of an allocation per argument. A value kept from
        // it keeps at most the command's few other bytes alive.
        let frame = Bytes::copy_from_slice(&buf[..frame_bytes]);
        buf.advance(frame_bytes);
        return spans.iter().map(|(start, stop)| frame.slice(*start..*stop)).collect();
    }
    if !spans.iter().any(|span| shares(*span)) {
        let args = spans.iter().map(|(start, stop)| Bytes::copy_from_slice(&buf[*start..*stop])).collect();
        // Nothing refers to the buffer: it stays unique and its space is reused.
        buf.advance(frame_bytes);
        return args;
    }
    let frame = buf.split_to(frame_bytes).freeze();
    spans
        .iter()
        .map(|span| {
            if shares(*span) {
                frame.slice(span.0..span.1)
            } else {
                Bytes::copy_from_slice(&frame[span.0..span.1])
            }
        })
        .collect()
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
    /// Nothing: the command answered through the connection's Pub/Sub mailbox (SUBSCRIBE
    /// and the like, whose confirmations are pushes; crate::pubsub).
    Pushed,
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
            Reply::Integer(value) => number_line(out, b':', *value),
            Reply::Bulk(bytes) => {
                number_line(out, b'$', bytes.len() as i64);
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
            Reply::Pushed => {}
        }
    }
}

fn line(out: &mut BytesMut, marker: u8, body: &[u8]) {
    out.put_u8(marker);
    out.put_slice(body);
    out.put_slice(b"\r\n");
}

/// `marker`, `value` in decimal, CRLF: without the `String` a `to_string` would allocate
/// for every bulk reply's length (issue 23: allocations per request).
fn number_line(out: &mut BytesMut, marker: u8, value: i64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = value.unsigned_abs();
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    out.put_u8(marker);
    if value < 0 {
        out.put_u8(b'-');
    }
    out.put_slice(&digits[at..]);
    out.put_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One call of a fresh parser (as if the command arrived in one read).
    fn parse_command(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        Parser::default().parse(buf, limits)
    }

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
        let limits = Limits { bulk_bytes_max: 10, args_max: 3, inline_bytes_max: 16, unauthenticated: false };
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
    fn before_auth_a_command_has_at_most_10_arguments_and_16_kib_per_bulk() {
        let limits = Limits::UNAUTHENTICATED;
        let error = parse_command(&mut BytesMut::from(&b"*11\r\n"[..]), &limits).unwrap_err();
        assert_eq!(error.to_string(), "Protocol error: unauthenticated multibulk length");
        let big = format!("*2\r\n$4\r\nAUTH\r\n${}\r\n", 16 * 1024 + 1);
        let error = parse_command(&mut BytesMut::from(big.as_bytes()), &limits).unwrap_err();
        assert_eq!(error.to_string(), "Protocol error: unauthenticated bulk length");
        let inline = format!("{}\r\n", "a ".repeat(11));
        assert!(parse_command(&mut BytesMut::from(inline.as_bytes()), &limits).is_err());
        let auth = b"*3\r\n$4\r\nAUTH\r\n$7\r\ndefault\r\n$2\r\npw\r\n";
        assert_eq!(parse_command(&mut BytesMut::from(&auth[..]), &limits).unwrap().unwrap().len(), 3);
    }

    #[test]
    fn a_declared_length_reserves_nothing() {
        let mut buf = BytesMut::with_capacity(64);
        buf.put_slice(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$60000000\r\nabc");
        let capacity = buf.capacity();
        let mut parser = Parser::default();
        assert_eq!(parser.parse(&mut buf, &Limits::default()), Ok(None));
        assert_eq!(buf.capacity(), capacity, "memory grows as bytes arrive, not from the header");
    }

    #[test]
    fn parsing_resumes_where_it_stopped() {
        let full = b"*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$5\r\nvalue\r\nPING\r\n*1\r\n$4\r\nPING\r\n";
        let mut parser = Parser::default();
        let mut buf = BytesMut::new();
        let mut commands = Vec::new();
        for byte in full {
            buf.put_u8(*byte);
            while let Some(args) = parser.parse(&mut buf, &Limits::default()).unwrap() {
                commands.push(args);
            }
        }
        assert_eq!(commands.len(), 3);
        assert_eq!(words(&commands[0]), ["SET", "key", "value"]);
        assert_eq!(words(&commands[1]), ["PING"]);
        // Mid-command, the parser has kept the arguments it already has.
        let mut buf = BytesMut::from(&full[..22]);
        assert_eq!(parser.parse(&mut buf, &Limits::default()), Ok(None));
        assert_eq!(parser.spans.len(), 2, "SET and key are parsed once, not again on the next read");
        assert_eq!(parser.pos, 22);
    }

    #[test]
    fn a_command_in_many_small_pieces_is_parsed_in_linear_time() {
        // 200,000 arguments in 64-byte reads: re-parsing from the start on every read would
        // look at ~10^11 bytes; resuming looks at each about once.
        let args: Vec<String> = (0..200_000).map(|i| i.to_string()).collect();
        let mut input = format!("*{}\r\n", args.len()).into_bytes();
        for arg in &args {
            input.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
        }
        let mut parser = Parser::default();
        let mut buf = BytesMut::new();
        let mut parsed = None;
        for piece in input.chunks(64) {
            buf.put_slice(piece);
            if let Some(args) = parser.parse(&mut buf, &Limits::default()).unwrap() {
                parsed = Some(args);
            }
        }
        assert_eq!(parsed.unwrap().len(), 200_000);
    }

    #[test]
    fn small_values_do_not_keep_the_read_buffer_alive() {
        let mut buf = BytesMut::with_capacity(16 * 1024);
        buf.put_slice(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nsmall\r\n");
        let range = buf.as_ptr() as usize..buf.as_ptr() as usize + buf.capacity();
        let args = parse_command(&mut buf, &Limits::default()).unwrap().unwrap();
        for arg in &args {
            assert!(!range.contains(&(arg.as_ptr() as usize)), "{arg:?} points into the read buffer");
        }
        // A large value that fills its buffer is shared rather than copied.
        let value = vec![b'x'; 1 << 20];
        let mut buf = BytesMut::from(&format!("*2\r\n$4\r\nECHO\r\n${}\r\n", value.len()).into_bytes()[..]);
        buf.put_slice(&value);
        buf.put_slice(b"\r\n");
        let range = buf.as_ptr() as usize..buf.as_ptr() as usize + buf.capacity();
        let args = parse_command(&mut buf, &Limits::default()).unwrap().unwrap();
        assert!(range.contains(&(args[1].as_ptr() as usize)));
        assert_eq!(args[1].len(), 1 << 20);
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
        assert_eq!(encoded(Reply::Integer(0), 2), ":0\r\n");
        assert_eq!(encoded(Reply::Integer(i64::MIN), 2), format!(":{}\r\n", i64::MIN));
        assert_eq!(encoded(Reply::Integer(i64::MAX), 2), format!(":{}\r\n", i64::MAX));
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
            let limits = Limits { bulk_bytes_max: 1024, args_max: 64, inline_bytes_max: 256, unauthenticated: false };
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
