//! CLIENT LIST, CLIENT KILL and RESET through the real binary with a real client: a node's
//! registry of connections, which another connection can list and close (issue 19, point 3).

use redis::Value;
use support::loopback::Cluster;

mod support;

fn client_ids(list: &str) -> Vec<u64> {
    list.lines()
        .map(|line| {
            let id = line.split(' ').next().and_then(|field| field.strip_prefix("id=")).expect("id= first");
            id.parse().expect("a number")
        })
        .collect()
}

#[test]
fn a_client_lists_and_kills_another_connection_of_its_node() {
    let cluster = Cluster::start(3, &["--protocol", "hermes"]);
    let (mut me, mut other) = (cluster.client(0), cluster.client(0));
    let _elsewhere = cluster.client(1);
    redis::cmd("CLIENT").arg("SETNAME").arg("victim").query::<()>(&mut other).expect("setname");
    let other_id: u64 = redis::cmd("CLIENT").arg("ID").query(&mut other).expect("id");
    let my_id: u64 = redis::cmd("CLIENT").arg("ID").query(&mut me).expect("id");

    // Both connections of node 0, not node 1's; with their names and real addresses.
    let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut me).expect("list");
    assert_eq!(client_ids(&list), [my_id, other_id], "{list}");
    assert!(list.contains("name=victim") && !list.contains("addr=?:0"), "{list}");
    let one: String =
        redis::cmd("CLIENT").arg("LIST").arg("ID").arg(other_id).query(&mut me).expect("list id");
    assert_eq!(client_ids(&one), [other_id]);

    // SKIPME yes (the default) spares the caller; the killed connection is gone from the list
    // at once, and its next command finds the socket closed.
    let killed: i64 =
        redis::cmd("CLIENT").arg("KILL").arg("ID").arg(my_id).query(&mut me).expect("kill self");
    assert_eq!(killed, 0);
    let killed: i64 = redis::cmd("CLIENT").arg("KILL").arg("ID").arg(other_id).query(&mut me).expect("kill");
    assert_eq!(killed, 1);
    let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut me).expect("list");
    assert_eq!(client_ids(&list), [my_id], "{list}");
    assert!(redis::cmd("PING").query::<Value>(&mut other).is_err(), "the killed connection still answers");

    // The old form takes an address and answers OK, or an error if no client has it.
    let error = redis::cmd("CLIENT").arg("KILL").arg("127.0.0.1:1").query::<Value>(&mut me).unwrap_err();
    assert!(error.to_string().contains("No such client"), "{error}");

    // RESET: back to a fresh connection's state.
    redis::cmd("CLIENT").arg("SETNAME").arg("named").query::<()>(&mut me).expect("setname");
    let reset: String = redis::cmd("RESET").query(&mut me).expect("reset");
    assert_eq!(reset, "RESET");
    let name: Option<String> = redis::cmd("CLIENT").arg("GETNAME").query(&mut me).expect("getname");
    assert_eq!(name, None);
}
