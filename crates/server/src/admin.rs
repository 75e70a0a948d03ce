//! Commands about the server or the calling connection that touch no data: TIME, LASTSAVE,
//! ACL, CLIENT LIST/INFO/..., CONFIG SET/RESETSTAT, SLOWLOG, LATENCY, LOLWUT. Pure functions
//! of what the connection knows, unit-tested without a network.

use std::time::Instant;

use bytes::Bytes;

use crate::clients::{ClientInfo, KillFilter};
use crate::connection::Shared;
use crate::live::DefaultUser;
use crate::resp::Reply;

/// What the answers need to know about the calling connection.
pub struct ClientView<'a> {
    pub id: u64,
    pub name: Option<Bytes>,
    pub resp: u8,
    pub started: Instant,
    /// The node: its clients (CLIENT LIST, CLIENT KILL), run-time settings, slow log, pause.
    pub shared: &'a Shared,
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
        "CONFIG" => config(args, client.shared),
        "SLOWLOG" => client.shared.monitor.slowlog(args),
        "LATENCY" => client.shared.monitor.latency(args),
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

/// The one user, `default`, whose passwords are `requirepass` or what ACL SETUSER set
/// (docs/resp.md, "ACL").
fn acl(args: &[Bytes], client: &ClientView) -> Reply {
    let Some(sub) = args.get(1).map(|a| word(a)) else { return arity("acl") };
    let user = client.shared.live.user();
    match sub.as_str() {
        "WHOAMI" => Reply::text("default"),
        "USERS" => Reply::Array(vec![Reply::text("default")]),
        "LIST" => Reply::Array(vec![Reply::text(&format!("user default {}", rules(&user)))]),
        "CAT" if args.len() == 2 => Reply::Array(CATEGORIES.iter().map(|c| Reply::text(c)).collect()),
        "CAT" => Reply::Array(commands_in(&String::from_utf8_lossy(&args[2]).to_ascii_lowercase())),
        "HELP" => Reply::Array(
            ["ACL WHOAMI", "ACL LIST", "ACL USERS", "ACL CAT [<category>]", "ACL GETUSER <username>", "ACL GENPASS [<bits>]", "ACL LOG"]
                .iter()
                .map(|line| Reply::text(line))
                .collect(),
        ),
        "GETUSER" if args.len() == 3 && args[2].as_ref() == b"default" => Reply::Map(vec![
            (Reply::text("flags"), Reply::Array(flags(&user).into_iter().map(Reply::text).collect())),
            (Reply::text("passwords"), Reply::Array(user.passwords.iter().map(|hash| Reply::text(&hex(hash))).collect())),
            (Reply::text("commands"), Reply::text("+@all")),
            (Reply::text("keys"), Reply::text("~*")),
            (Reply::text("channels"), Reply::text("&*")),
            (Reply::text("selectors"), Reply::Array(Vec::new())),
        ]),
        "GETUSER" => Reply::Null,
        "LOG" => Reply::Array(Vec::new()),
        "SETUSER" if args.len() >= 3 && args[2].as_ref() == b"default" => {
            match setuser(user, &args[3..]).and_then(|user| client.shared.live.set_user(user)) {
                Ok(()) => Reply::ok(),
                Err(why) => Reply::err(format!("Error in ACL SETUSER modifier: {why}")),
            }
        }
        "SETUSER" | "DELUSER" | "DRYRUN" | "LOAD" | "SAVE" => Reply::err(format!(
            "ACL {sub} is not supported: chorus has one user, 'default' (ACL SETUSER default changes its passwords)"
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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn flags(user: &DefaultUser) -> Vec<&'static str> {
    let mut flags = vec![if user.enabled { "on" } else { "off" }];
    if user.nopass {
        flags.push("nopass");
    }
    flags
}

/// ACL LIST's rule string for the default user.
fn rules(user: &DefaultUser) -> String {
    let mut rules: Vec<String> = flags(user).into_iter().map(String::from).collect();
    rules.extend(user.passwords.iter().map(|hash| format!("#{}", hex(hash))));
    rules.push("~* &* +@all".into());
    rules.join(" ")
}

/// ACL SETUSER default's rules, applied in order to a copy: all of them or none. Only the
/// rules about the user's state and passwords are taken; permissions stay everything
/// (`~*`, `&*`, `+@all` and their synonyms are accepted as they change nothing): a rule
/// that would restrict the user is refused rather than accepted and not enforced.
fn setuser(mut user: DefaultUser, rules: &[Bytes]) -> Result<DefaultUser, String> {
    for rule in rules {
        let text = String::from_utf8_lossy(rule);
        match rule.as_ref() {
            b"on" => user.enabled = true,
            b"off" => user.enabled = false,
            b"nopass" => {
                user.nopass = true;
                user.passwords.clear();
            }
            b"resetpass" => {
                user.nopass = false;
                user.passwords.clear();
            }
            b"~*" | b"allkeys" | b"%RW~*" | b"&*" | b"allchannels" | b"+@all" | b"allcommands" => {}
            [b'>', password @ ..] => {
                let hash = crate::live::digest(password);
                if !user.passwords.contains(&hash) {
                    user.passwords.push(hash);
                }
                user.nopass = false;
            }
            [b'<', password @ ..] => {
                let hash = crate::live::digest(password);
                let before = user.passwords.len();
                user.passwords.retain(|stored| *stored != hash);
                if user.passwords.len() == before {
                    return Err("no such password".into());
                }
            }
            [b'#', hash @ ..] | [b'!', hash @ ..] => {
                let hash = parse_hash(hash).ok_or("The password hash must be exactly 64 characters and contain only lowercase hexadecimal characters")?;
                if rule[0] == b'#' {
                    if !user.passwords.contains(&hash) {
                        user.passwords.push(hash);
                    }
                    user.nopass = false;
                } else {
                    let before = user.passwords.len();
                    user.passwords.retain(|stored| *stored != hash);
                    if user.passwords.len() == before {
                        return Err("no such password".into());
                    }
                }
            }
            _ => {
                return Err(format!(
                    "'{text}' is not supported: chorus' default user may run every command on every key and channel; only on, off, >pw, <pw, #hash, !hash, nopass, resetpass are taken"
                ))
            }
        }
    }
    Ok(user)
}

fn parse_hash(text: &[u8]) -> Option<[u8; 32]> {
    if text.len() != 64 || !text.iter().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c)) {
        return None;
    }
    let mut hash = [0u8; 32];
    for (at, pair) in text.chunks(2).enumerate() {
        hash[at] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(hash)
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
/// `cmd` is the command's name without its subcommand (`client`, where Redis says
/// `client|list`).
fn client_line(client: &ClientInfo) -> String {
    let name = client.name.as_ref().map(|n| String::from_utf8_lossy(n).into_owned()).unwrap_or_default();
    let [sub, psub, ssub] = client.subscriptions();
    let flags = if client.kind() == "pubsub" { "P" } else { "N" };
    format!(
        "id={} addr={} laddr={} fd=-1 name={} age={} idle=0 flags={flags} db=0 sub={sub} psub={psub} \
         ssub={ssub} multi=-1 qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem=0 \
         tot-mem=0 events=r cmd={} user=default redir=-1 resp={} lib-name= lib-ver=",
        client.id,
        client.addr,
        client.laddr,
        name,
        client.connected.elapsed().as_secs(),
        client.last_command(),
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
        None => client_lines(&client.shared.clients.list(None)),
        Some("TYPE") if args.len() == 4 => match word(&args[3]).as_str() {
            kind @ ("NORMAL" | "PUBSUB") => {
                let mut clients = client.shared.clients.list(None);
                clients.retain(|client| client.kind().eq_ignore_ascii_case(kind));
                client_lines(&clients)
            }
            "MASTER" | "REPLICA" | "SLAVE" => Reply::Verbatim(String::new()),
            other => Reply::err(format!("Unknown client type '{other}'")),
        },
        Some("ID") if args.len() > 3 => {
            let ids: Result<Vec<u64>, _> =
                args[3..].iter().map(|id| String::from_utf8_lossy(id).parse::<u64>()).collect();
            match ids {
                Ok(ids) => client_lines(&client.shared.clients.list(Some(&ids))),
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
        return match client.shared.clients.kill(&filter, client.id) {
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
    Reply::Integer(client.shared.clients.kill(&filter, client.id) as i64)
}

/// One `filter value` pair of CLIENT KILL into `filter`. A TYPE other than normal and
/// pubsub matches no client chorus has: it becomes an ID no client has.
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
            "normal" => filter.kind = Some("normal"),
            "pubsub" => filter.kind = Some("pubsub"),
            "master" | "replica" | "slave" => filter.id = Some(0),
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
        "INFO" => match client.shared.clients.get(client.id) {
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
        "PAUSE" => client_pause(args, client),
        "UNPAUSE" if args.len() == 2 => {
            client.shared.pause.stop();
            Reply::ok()
        }
        // Tracking is off, and can only be turned off: invalidating a client's cache would
        // need every replica to report the keys it applies (docs/resp.md, "What is missing").
        "TRACKING" => match args.get(2).map(|a| word(a)).as_deref() {
            Some("OFF") => Reply::ok(),
            Some("ON") => Reply::err(
                "CLIENT TRACKING ON is not supported by chorus: a key written through another replica could not be invalidated",
            ),
            _ => Reply::err("syntax error"),
        },
        "TRACKINGINFO" if args.len() == 2 => Reply::Map(vec![
            (Reply::text("flags"), Reply::Array(vec![Reply::text("off")])),
            (Reply::text("redirect"), Reply::Integer(-1)),
            (Reply::text("prefixes"), Reply::Array(Vec::new())),
        ]),
        other => Reply::err(format!(
            "CLIENT {other} is not supported by chorus (only LIST, INFO, KILL, ID, SETNAME, GETNAME, SETINFO, NO-EVICT, NO-TOUCH, PAUSE, UNPAUSE, REPLY, TRACKING OFF, TRACKINGINFO)"
        )),
    }
}

/// CLIENT PAUSE timeout [WRITE|ALL]: this node's clients wait (pause.rs).
fn client_pause(args: &[Bytes], client: &ClientView) -> Reply {
    let timeout_ms = match args.get(2).map(|arg| chorus_core::data::parse_int(arg)) {
        Some(Ok(ms)) if ms >= 0 => ms as u64,
        Some(_) => return Reply::err("timeout is not an integer or out of range"),
        None => return arity("client|pause"),
    };
    let mode = match args.get(3).map(|a| word(a)).as_deref() {
        None | Some("ALL") if args.len() <= 4 => crate::pause::Mode::All,
        Some("WRITE") if args.len() == 4 => crate::pause::Mode::Write,
        _ => return Reply::err("syntax error"),
    };
    client.shared.pause.start(timeout_ms, mode);
    Reply::ok()
}

fn config(args: &[Bytes], shared: &Shared) -> Reply {
    match word(&args[1]).as_str() {
        "SET" if args.len() < 4 || !args.len().is_multiple_of(2) => arity("config|set"),
        "SET" => {
            let pairs: Vec<(String, Vec<u8>)> = args[2..]
                .chunks(2)
                .map(|pair| (String::from_utf8_lossy(&pair[0]).to_ascii_lowercase(), pair[1].to_vec()))
                .collect();
            match shared.live.set(&pairs) {
                Ok(()) => Reply::ok(),
                Err(why) => Reply::err(why),
            }
        }
        "RESETSTAT" if args.len() == 2 => {
            shared.metrics.reset_stats();
            Reply::ok()
        }
        other => Reply::err(format!("CONFIG {other} is not supported")),
    }
}
