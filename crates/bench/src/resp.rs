//! A small RESP2 client for the hot path: commands are encoded straight into one write buffer,
//! replies are parsed in place and summarised (the load generator never needs their contents),
//! so a pipelined batch costs one `write` and as few `read`s as the kernel allows.

use std::net::SocketAddr;

use anyhow::{bail, Context as _};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// What a reply was, without its payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Status,
    Error(String),
    Int(i64),
    Bulk,
    Nil,
    /// An array with this many elements (nested elements are skipped).
    Array(usize),
}

/// Parses one reply from the front of `buf`: `Ok(None)` when incomplete.
pub fn parse(buf: &[u8]) -> anyhow::Result<Option<(Reply, usize)>> {
    let Some(line_end) = find_crlf(buf) else { return Ok(None) };
    if line_end == 0 {
        bail!("empty RESP line");
    }
    let line = &buf[1..line_end];
    let after = line_end + 2;
    match buf[0] {
        b'+' => Ok(Some((Reply::Status, after))),
        b'-' => Ok(Some((Reply::Error(String::from_utf8_lossy(line).into_owned()), after))),
        b':' => Ok(Some((Reply::Int(parse_int(line)?), after))),
        b'$' => {
            let len = parse_int(line)?;
            if len < 0 {
                return Ok(Some((Reply::Nil, after)));
            }
            let end = after + len as usize + 2;
            if buf.len() < end {
                return Ok(None);
            }
            Ok(Some((Reply::Bulk, end)))
        }
        b'*' => {
            let count = parse_int(line)?;
            if count < 0 {
                return Ok(Some((Reply::Nil, after)));
            }
            let mut at = after;
            for _ in 0..count {
                match parse(&buf[at..])? {
                    Some((_, used)) => at += used,
                    None => return Ok(None),
                }
            }
            Ok(Some((Reply::Array(count as usize), at)))
        }
        other => bail!("unexpected RESP type byte {other:#04x}"),
    }
}

fn find_crlf(buf: &[u8]) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = buf[from..].iter().position(|&b| b == b'\r') {
        let at = from + i;
        if at + 1 >= buf.len() {
            return None;
        }
        if buf[at + 1] == b'\n' {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

fn parse_int(digits: &[u8]) -> anyhow::Result<i64> {
    std::str::from_utf8(digits)
        .ok()
        .and_then(|text| text.parse().ok())
        .with_context(|| format!("bad RESP integer {:?}", String::from_utf8_lossy(digits)))
}

/// Encodes `*N $len arg ...` into `out`.
pub fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.push(b'*');
    push_decimal(out, args.len());
    out.extend_from_slice(b"\r\n");
    for arg in args {
        out.push(b'$');
        push_decimal(out, arg.len());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

fn push_decimal(out: &mut Vec<u8>, mut value: usize) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// One connection.
pub struct RespConn {
    stream: TcpStream,
    /// Commands queued since the last flush.
    pub wbuf: Vec<u8>,
    rbuf: Vec<u8>,
    rpos: usize,
}

impl RespConn {
    pub async fn connect(addr: SocketAddr) -> anyhow::Result<RespConn> {
        let stream = TcpStream::connect(addr).await.with_context(|| format!("cannot connect to {addr}"))?;
        stream.set_nodelay(true)?;
        Ok(RespConn {
            stream,
            wbuf: Vec::with_capacity(16 * 1024),
            rbuf: Vec::with_capacity(16 * 1024),
            rpos: 0,
        })
    }

    /// Queues a command (sent by [`RespConn::flush`]).
    pub fn push(&mut self, args: &[&[u8]]) {
        encode(&mut self.wbuf, args);
    }

    pub async fn flush(&mut self) -> anyhow::Result<()> {
        self.stream.write_all(&self.wbuf).await.context("write to server")?;
        self.wbuf.clear();
        Ok(())
    }

    /// The next reply.
    pub async fn read(&mut self) -> anyhow::Result<Reply> {
        loop {
            if self.rpos < self.rbuf.len() {
                if let Some((reply, used)) = parse(&self.rbuf[self.rpos..])? {
                    self.rpos += used;
                    if self.rpos == self.rbuf.len() {
                        self.rbuf.clear();
                        self.rpos = 0;
                    }
                    return Ok(reply);
                }
            }
            if self.rpos > 0 {
                self.rbuf.drain(..self.rpos);
                self.rpos = 0;
            }
            self.rbuf.reserve(16 * 1024);
            let read = self.stream.read_buf(&mut self.rbuf).await.context("read from server")?;
            if read == 0 {
                bail!("server closed the connection");
            }
        }
    }

    /// Sends one command and waits for its reply.
    pub async fn call(&mut self, args: &[&[u8]]) -> anyhow::Result<Reply> {
        self.push(args);
        self.flush().await?;
        self.read().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_reply_type_and_waits_for_more() {
        let cases: &[(&[u8], Reply)] = &[
            (b"+OK\r\n", Reply::Status),
            (b"-ERR boom\r\n", Reply::Error("ERR boom".into())),
            (b":42\r\n", Reply::Int(42)),
            (b"$3\r\nabc\r\n", Reply::Bulk),
            (b"$-1\r\n", Reply::Nil),
            (b"*2\r\n$1\r\na\r\n*1\r\n:1\r\n", Reply::Array(2)),
            (b"*-1\r\n", Reply::Nil),
        ];
        for (bytes, reply) in cases {
            assert_eq!(parse(bytes).unwrap(), Some((reply.clone(), bytes.len())));
            for cut in 0..bytes.len() {
                assert_eq!(
                    parse(&bytes[..cut]).unwrap(),
                    None,
                    "{:?} cut at {cut}",
                    String::from_utf8_lossy(bytes)
                );
            }
        }
        assert!(parse(b"?x\r\n").is_err());
        let mut out = Vec::new();
        encode(&mut out, &[b"SET", b"k", b"value"]);
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nvalue\r\n");
    }
}
