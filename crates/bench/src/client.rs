//! Executors: perform [`Op`]s against a RESP server (Chorus, Redis) or etcd.

use std::future::Future;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::etcd::{b64, prefix_end, EtcdConn};
use crate::generator::Rng;
use crate::resp::{Reply, RespConn};
use crate::workload::{field_name, kv_key, ycsb_key, Op};

/// Which API the targets speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// RESP (Chorus, Redis).
    Resp,
    /// etcd v3 through its HTTP/JSON gateway.
    Etcd,
}

/// How records and keys are named and shaped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Keyspace {
    /// YCSB records: hashes `user<fnv(n)>` of `fields` fields of `value_bytes` each (etcd: one
    /// key per field, `user<fnv(n)>/field<i>`).
    Ycsb { fields: u32 },
    /// Strings `key:<n>` (GET/SET).
    Kv,
}

/// Follow every write with `WAIT replicas timeout_ms` (Redis' synchronous replication).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wait {
    pub replicas: u32,
    pub timeout_ms: u64,
    /// `WAITAOF <local> <replicas> <timeout>` (Redis 7.2: the write is in this many local and
    /// replica append-only files) instead of `WAIT`.
    pub aof_local: Option<u32>,
}

/// Options every client of a run shares.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub api: Api,
    pub keyspace: Keyspace,
    pub value_bytes: usize,
    pub wait: Option<Wait>,
    pub seed: u64,
}

/// Performs a batch of operations; `errors[i]` is set for each operation that failed.
/// An `Err` is fatal for the client (I/O or protocol error).
pub trait Executor: Send {
    fn execute<'a>(
        &'a mut self,
        ops: &'a [Op],
        errors: &'a mut Vec<Option<String>>,
    ) -> impl Future<Output = anyhow::Result<()>> + Send + 'a;
}

/// Random printable values, sliced at random offsets (no allocation per operation).
struct Values {
    bytes: Vec<u8>,
    b64: Vec<String>,
    value_bytes: usize,
}

const VALUE_VARIANTS: usize = 16;

impl Values {
    fn new(rng: &mut Rng, value_bytes: usize) -> Values {
        let bytes: Vec<u8> = (0..value_bytes + 1024).map(|_| b'!' + rng.below(94) as u8).collect();
        let b64 = (0..VALUE_VARIANTS).map(|i| b64(&bytes[i * 17..i * 17 + value_bytes])).collect();
        Values { bytes, b64, value_bytes }
    }

    fn pick(&self, rng: &mut Rng) -> &[u8] {
        let offset = rng.below(1024) as usize;
        &self.bytes[offset..offset + self.value_bytes]
    }

    fn pick_b64(&self, rng: &mut Rng) -> &str {
        &self.b64[rng.below(VALUE_VARIANTS as u64) as usize]
    }
}

/// What a reply must look like.
#[derive(Clone, Copy)]
enum Check {
    Any,
    /// A record read: a non-empty array (HGETALL) or an array with a non-nil value (HMGET).
    Found,
    Wait(u32),
}

enum Transport {
    Resp(RespConn),
    Etcd(EtcdConn),
}

/// One client connection with its scratch buffers.
pub struct Client {
    transport: Transport,
    config: ClientConfig,
    rng: Rng,
    values: Values,
    key: Vec<u8>,
    expect: Vec<(usize, Check)>,
    fields: Vec<Vec<u8>>,
}

impl Client {
    pub async fn connect(addr: SocketAddr, config: ClientConfig, index: u64) -> anyhow::Result<Client> {
        let transport = match config.api {
            Api::Resp => Transport::Resp(RespConn::connect(addr).await?),
            Api::Etcd => Transport::Etcd(EtcdConn::connect(addr).await?),
        };
        let mut rng = Rng::stream(config.seed ^ 0x005E_ED0F_7A1E, index);
        let values = Values::new(&mut rng, config.value_bytes);
        let field_count = match config.keyspace {
            Keyspace::Ycsb { fields } => fields,
            Keyspace::Kv => 0,
        };
        let fields = (0..field_count)
            .map(|i| {
                let mut name = Vec::new();
                field_name(i, &mut name);
                name
            })
            .collect();
        Ok(Client { transport, config, rng, values, key: Vec::with_capacity(32), expect: Vec::new(), fields })
    }

    fn key_of(&mut self, keynum: u64) {
        match self.config.keyspace {
            Keyspace::Ycsb { .. } => ycsb_key(keynum, &mut self.key),
            Keyspace::Kv => kv_key(keynum, &mut self.key),
        }
    }

    /// Queues the RESP commands of `op` (for a read-modify-write: its read only).
    fn push_resp(&mut self, index: usize, op: &Op) {
        let Transport::Resp(conn) = &mut self.transport else { unreachable!() };
        match *op {
            Op::Read { keynum, field: Some(field) } => {
                ycsb_key(keynum, &mut self.key);
                conn.push(&[b"HMGET", &self.key, &self.fields[field as usize]]);
                self.expect.push((index, Check::Found));
                return;
            }
            Op::Read { keynum, field: None } | Op::ReadModifyWrite { keynum, .. } => {
                ycsb_key(keynum, &mut self.key);
                conn.push(&[b"HGETALL", &self.key]);
                self.expect.push((index, Check::Found));
                return;
            }
            Op::Scan { start, len } => {
                for keynum in start..start + len as u64 {
                    ycsb_key(keynum, &mut self.key);
                    conn.push(&[b"HGETALL", &self.key]);
                    self.expect.push((index, Check::Any));
                }
                return;
            }
            Op::Get { keynum } => {
                kv_key(keynum, &mut self.key);
                conn.push(&[b"GET", &self.key]);
                self.expect.push((index, Check::Any));
                return;
            }
            Op::Update { keynum, field } => {
                ycsb_key(keynum, &mut self.key);
                let value = self.values.pick(&mut self.rng);
                conn.push(&[b"HSET", &self.key, &self.fields[field as usize], value]);
            }
            Op::Insert { keynum } => {
                ycsb_key(keynum, &mut self.key);
                let mut args: Vec<&[u8]> = Vec::with_capacity(2 + 2 * self.fields.len());
                args.push(b"HSET");
                args.push(&self.key);
                for field in &self.fields {
                    args.push(field);
                    args.push(self.values.pick(&mut self.rng));
                }
                conn.push(&args);
            }
            Op::Set { keynum } => {
                kv_key(keynum, &mut self.key);
                let value = self.values.pick(&mut self.rng);
                conn.push(&[b"SET", &self.key, value]);
            }
        }
        // A write: its reply, then WAIT's.
        self.expect.push((index, Check::Any));
        if let Some(wait) = self.config.wait {
            push_wait(conn, wait);
            self.expect.push((index, wait_check(wait)));
        }
    }

    /// Queues the write half of a read-modify-write.
    fn push_resp_rmw_write(&mut self, index: usize, keynum: u64, field: u32) {
        let Transport::Resp(conn) = &mut self.transport else { unreachable!() };
        ycsb_key(keynum, &mut self.key);
        let value = self.values.pick(&mut self.rng);
        conn.push(&[b"HSET", &self.key, &self.fields[field as usize], value]);
        self.expect.push((index, Check::Any));
        if let Some(wait) = self.config.wait {
            push_wait(conn, wait);
            self.expect.push((index, wait_check(wait)));
        }
    }

    async fn round_trip(&mut self, errors: &mut [Option<String>]) -> anyhow::Result<()> {
        let Transport::Resp(conn) = &mut self.transport else { unreachable!() };
        conn.flush().await?;
        for (index, check) in self.expect.drain(..) {
            let reply = conn.read().await?;
            let problem = match (&reply, check) {
                (Reply::Error(message), _) => Some(message.clone()),
                (Reply::Nil, Check::Found) | (Reply::Array(0), Check::Found) => {
                    Some("record not found".to_string())
                }
                (Reply::Int(acked), Check::Wait(wanted)) if *acked < wanted as i64 => {
                    Some(format!("WAIT: {acked} of {wanted} replicas acknowledged in time"))
                }
                _ => None,
            };
            if let Some(problem) = problem {
                errors[index].get_or_insert(problem);
            }
        }
        Ok(())
    }

    async fn execute_resp(&mut self, ops: &[Op], errors: &mut [Option<String>]) -> anyhow::Result<()> {
        for (index, op) in ops.iter().enumerate() {
            self.push_resp(index, op);
        }
        self.round_trip(errors).await?;
        if ops.iter().any(|op| matches!(op, Op::ReadModifyWrite { .. })) {
            for (index, op) in ops.iter().enumerate() {
                if let Op::ReadModifyWrite { keynum, field } = *op {
                    if errors[index].is_none() {
                        self.push_resp_rmw_write(index, keynum, field);
                    }
                }
            }
            self.round_trip(errors).await?;
        }
        Ok(())
    }

    async fn execute_etcd(&mut self, op: &Op) -> anyhow::Result<Option<String>> {
        match *op {
            Op::Read { keynum, field } => self.etcd_read(keynum, field).await,
            Op::Update { keynum, field } => self.etcd_put_field(keynum, field).await.map(|()| None),
            Op::Insert { keynum } => {
                self.key_of(keynum);
                let fields = self.fields.len() as u32;
                let pairs: Vec<(Vec<u8>, &str)> = (0..fields)
                    .map(|field| (etcd_field_key(&self.key, field), self.values.pick_b64(&mut self.rng)))
                    .collect();
                let Transport::Etcd(conn) = &mut self.transport else { unreachable!() };
                conn.put_all(&pairs).await?;
                Ok(None)
            }
            Op::Scan { start, len } => {
                for keynum in start..start + len as u64 {
                    self.etcd_read(keynum, None).await?;
                }
                Ok(None)
            }
            Op::ReadModifyWrite { keynum, field } => {
                if let Some(problem) = self.etcd_read(keynum, None).await? {
                    return Ok(Some(problem));
                }
                self.etcd_put_field(keynum, field).await.map(|()| None)
            }
            Op::Get { keynum } => {
                kv_key(keynum, &mut self.key);
                let Transport::Etcd(conn) = &mut self.transport else { unreachable!() };
                conn.range(&self.key, None).await?;
                Ok(None)
            }
            Op::Set { keynum } => {
                kv_key(keynum, &mut self.key);
                let value = self.values.pick_b64(&mut self.rng);
                let Transport::Etcd(conn) = &mut self.transport else { unreachable!() };
                conn.put(&self.key, value).await?;
                Ok(None)
            }
        }
    }

    async fn etcd_read(&mut self, keynum: u64, field: Option<u32>) -> anyhow::Result<Option<String>> {
        self.key_of(keynum);
        let Transport::Etcd(conn) = &mut self.transport else { unreachable!() };
        let body = match field {
            Some(field) => conn.range(&etcd_field_key(&self.key, field), None).await?,
            None => {
                self.key.push(b'/');
                let end = prefix_end(&self.key);
                conn.range(&self.key, Some(&end)).await?
            }
        };
        let found = body.windows(6).any(|w| w == b"\"kvs\":");
        Ok((!found).then(|| "record not found".to_string()))
    }

    async fn etcd_put_field(&mut self, keynum: u64, field: u32) -> anyhow::Result<()> {
        self.key_of(keynum);
        let key = etcd_field_key(&self.key, field);
        let value = self.values.pick_b64(&mut self.rng);
        let Transport::Etcd(conn) = &mut self.transport else { unreachable!() };
        conn.put(&key, value).await
    }

    /// Inserts records (YCSB load) or keys (microworkload preload) `keynums`, batched:
    /// pipelined on RESP, one transaction of at most 100 puts on etcd.
    pub async fn load(&mut self, keynums: std::ops::Range<u64>) -> anyhow::Result<()> {
        match self.config.api {
            Api::Resp => {
                let ops: Vec<Op> = keynums
                    .map(|keynum| match self.config.keyspace {
                        Keyspace::Ycsb { .. } => Op::Insert { keynum },
                        Keyspace::Kv => Op::Set { keynum },
                    })
                    .collect();
                let mut errors = vec![None; ops.len()];
                let wait = self.config.wait.take();
                let result = self.execute_resp(&ops, &mut errors).await;
                self.config.wait = wait;
                result?;
                if let Some(problem) = errors.into_iter().flatten().next() {
                    anyhow::bail!("load failed: {problem}");
                }
                Ok(())
            }
            Api::Etcd => {
                let mut keys = Vec::new();
                for keynum in keynums {
                    self.key_of(keynum);
                    match self.config.keyspace {
                        Keyspace::Ycsb { fields } => {
                            keys.extend((0..fields).map(|field| etcd_field_key(&self.key, field)))
                        }
                        Keyspace::Kv => keys.push(self.key.clone()),
                    }
                }
                for chunk in keys.chunks(100) {
                    let pairs: Vec<(Vec<u8>, &str)> =
                        chunk.iter().map(|key| (key.clone(), self.values.pick_b64(&mut self.rng))).collect();
                    let Transport::Etcd(conn) = &mut self.transport else { unreachable!() };
                    conn.put_all(&pairs).await?;
                }
                Ok(())
            }
        }
    }
}

/// What a WAIT's reply must say; WAITAOF's (an array of two counts) is only checked to be no
/// error.
fn wait_check(wait: Wait) -> Check {
    match wait.aof_local {
        None => Check::Wait(wait.replicas),
        Some(_) => Check::Any,
    }
}

fn push_wait(conn: &mut RespConn, wait: Wait) {
    let mut replicas = Vec::with_capacity(4);
    let mut timeout = Vec::with_capacity(8);
    use std::io::Write as _;
    let _ = write!(replicas, "{}", wait.replicas);
    let _ = write!(timeout, "{}", wait.timeout_ms);
    match wait.aof_local {
        None => conn.push(&[b"WAIT", &replicas, &timeout]),
        Some(local) => {
            let mut local_text = Vec::with_capacity(4);
            let _ = write!(local_text, "{local}");
            conn.push(&[b"WAITAOF", &local_text, &replicas, &timeout]);
        }
    }
}

/// etcd has no hashes: a record's field `i` is the key `<record>/field<i>`, and reading the
/// whole record is a range over the prefix `<record>/`.
fn etcd_field_key(record: &[u8], field: u32) -> Vec<u8> {
    let mut key = Vec::with_capacity(record.len() + 8);
    key.extend_from_slice(record);
    key.push(b'/');
    let mut name = Vec::new();
    field_name(field, &mut name);
    key.extend_from_slice(&name);
    key
}

impl Executor for Client {
    async fn execute<'a>(
        &'a mut self,
        ops: &'a [Op],
        errors: &'a mut Vec<Option<String>>,
    ) -> anyhow::Result<()> {
        errors.clear();
        errors.resize(ops.len(), None);
        match self.config.api {
            Api::Resp => self.execute_resp(ops, errors).await,
            Api::Etcd => {
                for (index, op) in ops.iter().enumerate() {
                    errors[index] = self.execute_etcd(op).await?;
                }
                Ok(())
            }
        }
    }
}
