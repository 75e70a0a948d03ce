//! Pub/Sub (docs/resp.md, "Pub/Sub"): PUBLISH, SUBSCRIBE, PSUBSCRIBE, SSUBSCRIBE, SPUBLISH,
//! their UNSUBSCRIBEs and PUBSUB, with Redis 7's replies in RESP2 and RESP3.
//!
//! * [`hub`]: the node's subscription tables and each subscriber's [`Mailbox`].
//! * [`wire`]: a published message as it travels to the other nodes.
//!
//! Nothing here goes through the event loop or the replication protocol: a message is not
//! stored. PUBLISH delivers to this node's subscribers at once and sends one frame to each
//! other node over the peer links (`chorus_net::pubsub`), whose hub delivers it to its own.
//! A connection knows nothing of Pub/Sub until its first (un)subscribe command creates its
//! mailbox; from then on it writes what the hub queues there between its commands.

pub mod hub;
pub mod wire;

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::sync::Notify;

pub use hub::{Hub, Kind, Limit, Mailbox, OutputLimits};
use wire::Scope;

use crate::resp::Reply;

/// The commands [`Session::command`] answers.
pub const COMMANDS: &[&str] = &[
    "publish",
    "spublish",
    "subscribe",
    "psubscribe",
    "ssubscribe",
    "unsubscribe",
    "punsubscribe",
    "sunsubscribe",
    "pubsub",
];

/// What a RESP2 client may send while subscribed (Redis' pubsub context).
const ALLOWED_WHILE_SUBSCRIBED: &[&str] = &[
    "subscribe",
    "psubscribe",
    "ssubscribe",
    "unsubscribe",
    "punsubscribe",
    "sunsubscribe",
    "ping",
    "quit",
    "reset",
];

/// Commands whose name in errors and CLIENT LIST includes their subcommand (`client|list`).
const CONTAINERS: &[&str] = &[
    "acl", "client", "cluster", "command", "config", "latency", "memory", "module", "object", "pubsub",
    "slowlog", "xgroup", "xinfo",
];

/// One connection's Pub/Sub state: nothing until its first (un)subscribe command.
#[derive(Default)]
pub struct Session {
    mailbox: Option<Arc<Mailbox>>,
    /// Bytes taken from the mailbox into the write buffer and not yet written.
    unwritten: u64,
}

impl Session {
    /// Whether the connection ever (un)subscribed: it then waits for pushes too.
    pub fn active(&self) -> bool {
        self.mailbox.is_some()
    }

    pub fn mailbox(&self) -> Option<&Arc<Mailbox>> {
        self.mailbox.as_ref()
    }

    /// Whether the command `name` gets [`Session::in_context`]'s answer instead of running:
    /// a RESP2 client subscribed to anything may only (un)subscribe, PING, QUIT and RESET,
    /// and its PING is answered as a push.
    pub fn intercepts(&self, name: &str, resp: u8) -> bool {
        resp < 3
            && self.mailbox.as_ref().is_some_and(|mailbox| mailbox.subscribed())
            && (name == "ping" || !ALLOWED_WHILE_SUBSCRIBED.contains(&name))
    }

    /// The answer to an intercepted command, as Redis 7 gives it.
    pub fn in_context(name: &str, args: &[Bytes]) -> Reply {
        if name == "ping" {
            let message = args.get(1).cloned().unwrap_or_default();
            return Reply::Array(vec![Reply::text("pong"), Reply::Bulk(message)]);
        }
        Reply::err(format!(
            "Can't execute '{}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context",
            full_name(name, args)
        ))
    }

    /// Run a Pub/Sub command for client `client` (whose CLIENT KILL wake-up is `kill`).
    /// (Un)subscribing answers through the mailbox ([`Reply::Pushed`]): its confirmations
    /// then go out in order with the messages around them, as in Redis.
    pub fn command(&mut self, hub: &Hub, client: u64, kill: &Arc<Notify>, args: &[Bytes]) -> Reply {
        let name = String::from_utf8_lossy(&args[0]).to_ascii_lowercase();
        let subscribing = match name.as_str() {
            "publish" => return publish(hub, Scope::Global, &args[1], &args[2]),
            "spublish" => return publish(hub, Scope::Shard, &args[1], &args[2]),
            "pubsub" => return introspect(hub, args),
            "subscribe" => (Kind::Channel, true),
            "psubscribe" => (Kind::Pattern, true),
            "ssubscribe" => (Kind::Shard, true),
            "unsubscribe" => (Kind::Channel, false),
            "punsubscribe" => (Kind::Pattern, false),
            "sunsubscribe" => (Kind::Shard, false),
            other => return Reply::err(format!("unknown command '{other}'")),
        };
        let mailbox = self.mailbox.get_or_insert_with(|| Mailbox::new(client, kill.clone()));
        match subscribing {
            (kind, true) => hub.subscribe(mailbox, kind, &args[1..]),
            (kind, false) => hub.unsubscribe(mailbox, kind, &args[1..]),
        }
        Reply::Pushed
    }

    /// Move what the mailbox holds into `out`, encoded for protocol `resp`.
    pub fn take(&mut self, resp: u8, out: &mut BytesMut) {
        if let Some(mailbox) = &self.mailbox {
            self.unwritten += mailbox.take(resp, out);
        }
    }

    /// Everything taken so far has been written to the client.
    pub fn written(&mut self) {
        if self.unwritten > 0 {
            if let Some(mailbox) = &self.mailbox {
                mailbox.release(self.unwritten);
            }
            self.unwritten = 0;
        }
    }

    /// Wait until the hub may have queued something; forever if the connection never
    /// (un)subscribed.
    pub async fn woken(&self) {
        match &self.mailbox {
            Some(mailbox) => mailbox.woken().await,
            None => std::future::pending().await,
        }
    }

    /// Leave every subscription without confirmations (RESET, a connection that ends).
    pub fn forget(&self, hub: &Hub) {
        if let Some(mailbox) = &self.mailbox {
            hub.forget(mailbox.client);
        }
    }
}

/// `name`, or `name|subcommand` for commands that have subcommands, as Redis names them.
pub fn full_name(name: &str, args: &[Bytes]) -> String {
    match args.get(1) {
        Some(sub) if CONTAINERS.contains(&name) => {
            format!("{name}|{}", String::from_utf8_lossy(sub).to_ascii_lowercase())
        }
        _ => name.to_string(),
    }
}

fn publish(hub: &Hub, scope: Scope, channel: &Bytes, message: &Bytes) -> Reply {
    match hub.publish(scope, channel, message) {
        Ok(receivers) => Reply::Integer(receivers as i64),
        Err(why) => Reply::err(why),
    }
}

/// PUBSUB CHANNELS / NUMSUB / NUMPAT / SHARDCHANNELS / SHARDNUMSUB / HELP: this node's
/// subscribers, as each Redis Cluster node answers for its own.
fn introspect(hub: &Hub, args: &[Bytes]) -> Reply {
    let sub = String::from_utf8_lossy(&args[1]).to_ascii_uppercase();
    let arity =
        || Reply::err(format!("wrong number of arguments for '{}' command", full_name("pubsub", args)));
    let names = |kind| match args.len() {
        2 => list(hub.channels(kind, None)),
        3 => list(hub.channels(kind, Some(&args[2]))),
        _ => arity(),
    };
    let counts = |kind| {
        let names = &args[2..];
        let counts = hub.subscriber_counts(kind, names);
        Reply::Array(
            names
                .iter()
                .zip(counts)
                .flat_map(|(name, count)| [Reply::Bulk(name.clone()), Reply::Integer(count as i64)])
                .collect(),
        )
    };
    match sub.as_str() {
        "CHANNELS" => names(Kind::Channel),
        "SHARDCHANNELS" => names(Kind::Shard),
        "NUMSUB" => counts(Kind::Channel),
        "SHARDNUMSUB" => counts(Kind::Shard),
        "NUMPAT" if args.len() == 2 => Reply::Integer(hub.totals()[Kind::Pattern as usize] as i64),
        "NUMPAT" => arity(),
        "HELP" if args.len() == 2 => {
            list(HELP.iter().map(|line| Bytes::from_static(line.as_bytes())).collect())
        }
        _ => Reply::err(format!(
            "unknown subcommand '{}'. Try PUBSUB HELP.",
            String::from_utf8_lossy(&args[1])
        )),
    }
}

fn list(names: Vec<Bytes>) -> Reply {
    Reply::Array(names.into_iter().map(Reply::Bulk).collect())
}

const HELP: &[&str] = &[
    "PUBSUB <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CHANNELS [<pattern>]",
    "    Return the currently active channels matching a <pattern> (default: '*').",
    "NUMPAT",
    "    Return number of subscriptions to patterns.",
    "NUMSUB [<channel> ...]",
    "    Return the number of subscribers for the specified channels, excluding",
    "    pattern subscriptions(default: no channels).",
    "SHARDCHANNELS [<pattern>]",
    "    Return the currently active shard level channels matching a <pattern> (default: '*').",
    "SHARDNUMSUB [<shardchannel> ...]",
    "    Return the number of subscribers for the specified shard level channel(s)",
    "HELP",
    "    Prints this help.",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<Bytes> {
        line.split(' ').map(|word| Bytes::copy_from_slice(word.as_bytes())).collect()
    }

    fn encoded(reply: &Reply, resp: u8) -> String {
        let mut out = BytesMut::new();
        reply.encode(resp, &mut out);
        String::from_utf8(out.to_vec()).unwrap()
    }

    #[test]
    fn a_subscribed_resp2_client_may_only_subscribe_ping_quit_and_reset() {
        let hub = Hub::new(false);
        let kill = Arc::new(Notify::new());
        let mut session = Session::default();
        assert!(!session.intercepts("get", 2), "not subscribed yet");
        assert_eq!(session.command(&hub, 1, &kill, &args("SUBSCRIBE news")), Reply::Pushed);
        assert!(session.intercepts("get", 2) && session.intercepts("ping", 2));
        assert!(!session.intercepts("get", 3) && !session.intercepts("ping", 3), "RESP3 has no such context");
        for allowed in ["subscribe", "punsubscribe", "quit", "reset"] {
            assert!(!session.intercepts(allowed, 2), "{allowed}");
        }
        assert_eq!(encoded(&Session::in_context("ping", &args("PING")), 2), "*2\r\n$4\r\npong\r\n$0\r\n\r\n");
        assert_eq!(
            encoded(&Session::in_context("ping", &args("PING hi")), 2),
            "*2\r\n$4\r\npong\r\n$2\r\nhi\r\n"
        );
        assert_eq!(
            encoded(&Session::in_context("client", &args("CLIENT LIST")), 2),
            "-ERR Can't execute 'client|list': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context\r\n"
        );
        session.command(&hub, 1, &kill, &args("UNSUBSCRIBE"));
        assert!(!session.intercepts("get", 2), "subscribed to nothing again");
    }

    #[test]
    fn pubsub_introspection_answers_as_redis() {
        let hub = Hub::new(false);
        let kill = Arc::new(Notify::new());
        let mut session = Session::default();
        session.command(&hub, 1, &kill, &args("SUBSCRIBE ch1 ch2"));
        session.command(&hub, 1, &kill, &args("PSUBSCRIBE c*"));
        session.command(&hub, 1, &kill, &args("SSUBSCRIBE s1"));
        let run = |line: &str| encoded(&introspect(&hub, &args(line)), 2);
        assert_eq!(run("PUBSUB CHANNELS"), "*2\r\n$3\r\nch1\r\n$3\r\nch2\r\n");
        assert_eq!(run("PUBSUB NUMSUB ch1 zz"), "*4\r\n$3\r\nch1\r\n:1\r\n$2\r\nzz\r\n:0\r\n");
        assert_eq!(run("PUBSUB NUMPAT"), ":1\r\n");
        assert_eq!(run("PUBSUB SHARDCHANNELS"), "*1\r\n$2\r\ns1\r\n");
        assert_eq!(run("PUBSUB SHARDNUMSUB s1"), "*2\r\n$2\r\ns1\r\n:1\r\n");
        assert_eq!(run("PUBSUB FOO"), "-ERR unknown subcommand 'FOO'. Try PUBSUB HELP.\r\n");
        assert_eq!(run("PUBSUB NUMPAT x"), "-ERR wrong number of arguments for 'pubsub|numpat' command\r\n");
        let mut out = BytesMut::new();
        session.take(2, &mut out);
        assert!(out.starts_with(b"*3\r\n$9\r\nsubscribe\r\n$3\r\nch1\r\n:1\r\n"));
        session.written();
        session.forget(&hub);
        assert_eq!(run("PUBSUB CHANNELS"), "*0\r\n");
    }
}
