//! Commands about the server or the calling connection that touch no data: TIME, LASTSAVE,
//! ACL, CLIENT LIST/INFO/..., CONFIG SET/RESETSTAT, SLOWLOG, LATENCY, LOLWUT. Pure functions
//! of what the connection knows, unit-tested without a network.

use std::time::Instant;

use bytes::Bytes;

use crate::clients::{ClientInfo, KillFilter, Registry};
use crate::connection::Settings;
use crate::resp::Reply;

/// What the answers need to know about the calling connection.
pub struct ClientView<'a> {
    pub id: u64,
    pub name: Option<Bytes>,
    pub resp: u8,
    pub started: Instant,
    pub settings: &'a Settings,
    /// The node's connected clients (CLIENT LIST, CLIENT KILL).
    pub clients: &'a Registry,
}

fn word(arg: &[u8]) -> String {
    String::from_utf8_lossy(arg).to_ascii_uppercase()
}

fn arity(name: &str) -> Reply {
    Reply::err(format!("wrong number of arguments for '{name}' command"))
}

/// Answer one admin command (`args[0]` is its name).
pub fn run(args: &[Bytes], client: &ClientView) -> Reply {
    match word(&args[0]).as_str() {
        "TIME" => time(),
        "LASTSAVE" => {
            // Nothing is ever saved with SAVE/BGSAVE: the last "save" is the start.
            let now_s = crate::command::wall_clock_ms() / 1000;
            Reply::Integer((now_s - client.started.elapsed().as_secs()) as i64)
        }
        "ACL" => acl(args, client),
        "CLIENT" => client_command(args, client),
        "CONFIG" => config(args),
        "SLOWLOG" => slowlog(args),
        "LATENCY" => latency(args),
        "LOLWUT" => Reply::Verbatim(format!(
            "Chorus {}, speaking Redis ver. {}\n",
            env!("CARGO_PKG_VERSION"),
            crate::REDIS_COMPATIBLE_VERSION
        )),
        // Every replica takes writes (the protocol orders them): each is a master to a client.
        "ROLE" => Reply::Array(vec![Reply::text("master"), Reply::Integer(0), Reply::Array(Vec::new())]),
        "MODULE" => match word(&args[1]).as_str() {
            "LIST" => Reply::Array(Vec::new()),
            sub => Reply::err(format!("MODULE {sub} is not supported: chorus loads no modules")),
        },
        "MEMORY" => memory(args),
        other => Reply::err(format!("unknown command '{other}'")),
    }
}

fn time() -> Reply {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    Reply::Array(vec![Reply::text(&now.as_secs().to_string()), Reply::text(&now.subsec_micros().to_string())])
}

/// The one user, `default`, with the node's `requirepass` (docs/resp.md, "ACL").
fn acl(args: &[Bytes], client: &ClientView) -> Reply {
    let Some(sub) = args.get(1).map(|a| word(a)) else { return arity("acl") };
    let password = client.settings.requirepass.is_some();
    let rule = if password { "on #<redacted> ~* &* +@all" } else { "on nopass sanitize-payload ~* &* +@all" };
    match sub.as_str() {
        "WHOAMI" => Reply::text("default"),
        "USERS" => Reply::Array(vec![Reply::text("default")]),
        "LIST" => Reply::Array(vec![Reply::text(&format!("user default {rule}"))]),
        "CAT" if args.len() == 2 => Reply::Array(CATEGORIES.iter().map(|c| Reply::text(c)).collect()),
        "CAT" => Reply::Array(commands_in(&String::from_utf8_lossy(&args[2]).to_ascii_lowercase())),
        "HELP" => Reply::Array(
            ["ACL WHOAMI", "ACL LIST", "ACL USERS", "ACL CAT [<category>]", "ACL GETUSER <username>", "ACL GENPASS [<bits>]", "ACL LOG"]
                .iter()
                .map(|line| Reply::text(line))
                .collect(),
        ),
        "GETUSER" if args.len() == 3 && args[2].as_ref() == b"default" => Reply::Map(vec![
            (Reply::text("flags"), Reply::Array(vec![Reply::text("on")])),
            (Reply::text("passwords"), Reply::Array(Vec::new())),
            (Reply::text("commands"), Reply::text("+@all")),
            (Reply::text("keys"), Reply::text("~*")),
            (Reply::text("channels"), Reply::text("&*")),
            (Reply::text("selectors"), Reply::Array(Vec::new())),
        ]),
        "GETUSER" => Reply::Null,
        "LOG" => Reply::Array(Vec::new()),
        "SETUSER" | "DELUSER" | "DRYRUN" | "LOAD" | "SAVE" => Reply::err(format!(
            "ACL {sub} is not supported: chorus has one user, 'default', whose password is requirepass in the node's config file"
        )),
        "GENPASS" => {
            // As Redis: `bits` (default 256) rounded up to whole hex digits.
            let bits = match args.get(2).map(|arg| chorus_core::data::parse_int(arg)) {
                None => 256,
                Some(Ok(bits)) if (1..=4096).contains(&bits) => bits as usize,
                Some(_) => return Reply::err("ACL GENPASS argument must be the number of bits for the output password, a positive number up to 4096"),
            };
            let mut bytes = vec![0u8; bits.div_ceil(8)];
            getrandom_fill(&mut bytes);
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            Reply::text(&hex[..bits.div_ceil(4)])
        }
        _ => Reply::err(format!("unknown subcommand '{sub}'. Try ACL HELP.")),
    }
}

/// Random bytes without a new dependency: the std hasher's per-process random keys.
fn getrandom_fill(bytes: &mut [u8]) {
    use std::hash::{BuildHasher, Hasher};
    for (at, chunk) in bytes.chunks_mut(8).enumerate() {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_usize(at);
        chunk.copy_from_slice(&hasher.finish().to_le_bytes()[..chunk.len()]);
    }
}

const CATEGORIES: &[&str] = &[
    "keyspace",
    "read",
    "write",
    "set",
    "sortedset",
    "list",
    "hash",
    "string",
    "bitmap",
    "hyperloglog",
    "geo",
    "stream",
    "pubsub",
    "admin",
    "fast",
    "slow",
    "blocking",
    "dangerous",
    "connection",
    "transaction",
    "scripting",
];

/// ACL CAT <category>: the commands of the read and write categories (the flags in COMMAND);
/// every other category is answered empty.
fn commands_in(category: &str) -> Vec<Reply> {
    let flag = match category {
        "read" => "readonly",
        "write" => "write",
        _ => return Vec::new(),
    };
    crate::command::COMMAND_TABLE
        .iter()
        .filter(|spec| spec.flags.contains(&flag))
        .map(|spec| Reply::text(spec.name))
        .collect()
}

/// MEMORY STATS / MALLOC-STATS / DOCTOR: the allocator's figure, as INFO memory has it.
fn memory(args: &[Bytes]) -> Reply {
    let used = crate::memory::used_bytes();
    match word(&args[1]).as_str() {
        "STATS" => Reply::Map(vec![
            (Reply::text("peak.allocated"), Reply::Integer(used as i64)),
            (Reply::text("total.allocated"), Reply::Integer(used as i64)),
            (Reply::text("startup.allocated"), Reply::Integer(0)),
            (Reply::text("dataset.bytes"), Reply::Integer(used as i64)),
        ]),
        "MALLOC-STATS" => Reply::Verbatim(format!("chorus: {used} bytes allocated\n")),
        "DOCTOR" => Reply::Verbatim("Chorus has no memory problems to report.\n".into()),
        sub => Reply::err(format!("unknown subcommand '{sub}'. Try MEMORY HELP.")),
    }
}

/// One client's CLIENT LIST line (Redis' format; fields chorus does not track read 0).
fn client_line(client: &ClientInfo) -> String {
    let name = client.name.as_ref().map(|n| String::from_utf8_lossy(n).into_owned()).unwrap_or_default();
    format!(
        "id={} addr={} laddr={} fd=-1 name={} age={} idle=0 flags=N db=0 sub=0 psub=0 ssub=0 multi=-1 \
         qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem=0 tot-mem=0 events=r \
         cmd=client|list user=default redir=-1 resp={} lib-name= lib-ver=",
        client.id,
        client.addr,
        client.laddr,
        name,
        client.connected.elapsed().as_secs(),
        client.resp
    )
}

fn client_lines(clients: &[ClientInfo]) -> Reply {
    Reply::Verbatim(clients.iter().map(|client| format!("{}\n", client_line(client))).collect())
}

/// CLIENT LIST `[TYPE normal|master|replica|pubsub] [ID id...]`: this node's clients (all of
/// them normal ones).
fn client_list(args: &[Bytes], client: &ClientView) -> Reply {
    match args.get(2).map(|arg| word(arg)).as_deref() {
        None => client_lines(&client.clients.list(None)),
        Some("TYPE") if args.len() == 4 => match word(&args[3]).as_str() {
            "NORMAL" => client_lines(&client.clients.list(None)),
            "MASTER" | "REPLICA" | "SLAVE" | "PUBSUB" => Reply::Verbatim(String::new()),
            other => Reply::err(format!("Unknown client type '{other}'")),
        },
        Some("ID") if args.len() > 3 => {
            let ids: Result<Vec<u64>, _> =
                args[3..].iter().map(|id| String::from_utf8_lossy(id).parse::<u64>()).collect();
            match ids {
                Ok(ids) => client_lines(&client.clients.list(Some(&ids))),
                Err(_) => Reply::err("Invalid client ID"),
            }
        }
        _ => Reply::err("syntax error"),
    }
}

/// CLIENT KILL `addr` (the old form: OK or an error) or `filter value ...` (how many).
fn client_kill(args: &[Bytes], client: &ClientView) -> Reply {
    if args.len() == 3 {
        let filter = KillFilter {
            addr: Some(String::from_utf8_lossy(&args[2]).into_owned()),
            ..KillFilter::default()
        };
        return match client.clients.kill(&filter, client.id) {
            0 => Reply::err("No such client"),
            _ => Reply::ok(),
        };
    }
    if args.len() < 4 || !args.len().is_multiple_of(2) {
        return Reply::err("syntax error");
    }
    let mut filter = KillFilter { skip_me: true, ..KillFilter::default() };
    for pair in args[2..].chunks(2) {
        if let Err(reply) = kill_filter(&mut filter, &word(&pair[0]), &pair[1]) {
            return reply;
        }
    }
    Reply::Integer(client.clients.kill(&filter, client.id) as i64)
}

/// One `filter value` pair of CLIENT KILL into `filter`. A TYPE other than normal matches
/// no client chorus has: it becomes an ID no client has.
fn kill_filter(filter: &mut KillFilter, name: &str, value: &[u8]) -> Result<(), Reply> {
    let text = String::from_utf8_lossy(value).into_owned();
    let number = || text.parse::<u64>().map_err(|_| Reply::err("syntax error"));
    match name {
        "ID" => filter.id = Some(number()?),
        "ADDR" => filter.addr = Some(text),
        "LADDR" => filter.laddr = Some(text),
        "USER" => filter.user = Some(text),
        "MAXAGE" => filter.max_age_s = Some(number()?),
        "TYPE" => match text.to_ascii_lowercase().as_str() {
            "normal" => {}
            "master" | "replica" | "slave" | "pubsub" => filter.id = Some(0),
            _ => return Err(Reply::err(format!("Unknown client type '{text}'"))),
        },
        "SKIPME" => match text.to_ascii_lowercase().as_str() {
            "yes" => filter.skip_me = true,
            "no" => filter.skip_me = false,
            _ => return Err(Reply::err("syntax error")),
        },
        _ => return Err(Reply::err("syntax error")),
    }
    Ok(())
}

fn client_command(args: &[Bytes], client: &ClientView) -> Reply {
    match word(&args[1]).as_str() {
        "LIST" => client_list(args, client),
        "INFO" => match client.clients.get(client.id) {
            Some(me) => Reply::Verbatim(format!("{}\n", client_line(&me))),
            None => Reply::err("internal error: this client is not registered"),
        },
        "KILL" => client_kill(args, client),
        "NO-EVICT" | "NO-TOUCH" => match args.get(2).map(|a| word(a)).as_deref() {
            Some("ON" | "OFF") if args.len() == 3 => Reply::ok(),
            _ => Reply::err("syntax error"),
        },
        "GETREDIR" => Reply::Integer(-1),
        "UNBLOCK" => Reply::Integer(0),
        other => Reply::err(format!(
            "CLIENT {other} is not supported by chorus (only LIST, INFO, KILL, ID, SETNAME, GETNAME, SETINFO, NO-EVICT, NO-TOUCH)"
        )),
    }
}

fn config(args: &[Bytes]) -> Reply {
    match word(&args[1]).as_str() {
        "SET" if args.len() < 4 || !args.len().is_multiple_of(2) => arity("config|set"),
        "SET" => Reply::err(format!(
            "CONFIG SET '{}' is not supported: chorus reads its settings from the node's config file at start",
            String::from_utf8_lossy(&args[2])
        )),
        "RESETSTAT" => Reply::err("CONFIG RESETSTAT is not supported: chorus' counters are monotonic (Prometheus counters)"),
        other => Reply::err(format!("CONFIG {other} is not supported")),
    }
}

/// Chorus keeps no slow log: the per-command latency histograms are on the metrics port.
fn slowlog(args: &[Bytes]) -> Reply {
    match word(&args[1]).as_str() {
        "GET" => Reply::Array(Vec::new()),
        "LEN" => Reply::Integer(0),
        "RESET" => Reply::ok(),
        other => Reply::err(format!("unknown subcommand '{other}'. Try SLOWLOG HELP.")),
    }
}

fn latency(args: &[Bytes]) -> Reply {
    match word(&args[1]).as_str() {
        "LATEST" | "HISTORY" => Reply::Array(Vec::new()),
        "RESET" => Reply::Integer(0),
        "DOCTOR" => Reply::Verbatim("Chorus records per-command latency histograms on its metrics port (docs/operations.md); LATENCY has no events to report.\n".into()),
        other => Reply::err(format!("unknown subcommand '{other}'. Try LATENCY HELP.")),
    }
}
