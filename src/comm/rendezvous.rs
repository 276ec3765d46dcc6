//! How ranks started as separate processes find each other, from the variables torchrun and
//! Slurm wrappers set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).
//!
//! Rank 0 listens on MASTER_ADDR:MASTER_PORT. Every other rank connects (retrying until rank 0
//! is up) and says who it is: its rank, the world size it was given, a hash of its arguments and
//! the address of its own data listener. Rank 0 checks them all, then answers every rank with
//! either the address table and a payload (for NCCL: the unique id) or one error sentence, which
//! every rank then reports. A hello rank 0 accepts is acknowledged at once, so a rank that
//! reached some other program listening on the port says so within its timeout instead of
//! waiting for a table that never comes. Nothing waits without a deadline.

use crate::error::Error;
use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The launch variables of one rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchEnv {
    pub rank: usize,
    pub world: usize,
    pub local_rank: usize,
    pub master_addr: String,
    pub master_port: u16,
}

impl LaunchEnv {
    /// Reads the launch variables through `get`. `Ok(None)` when neither RANK nor WORLD_SIZE is
    /// set: a plain single-process run.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<LaunchEnv>> {
        let present: Vec<&str> = ["RANK", "WORLD_SIZE"]
            .into_iter()
            .filter(|name| get(name).is_some())
            .collect();
        if present.is_empty() {
            return Ok(None);
        }
        let need = |name: &str| {
            get(name).ok_or_else(|| {
                anyhow!("{name} is not set but {} is: start ranks with `distflash launch` or torchrun, which set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT", present.join(" and "))
            })
        };
        let number = |name: &str| -> Result<usize> {
            let v = need(name)?;
            v.trim()
                .parse()
                .map_err(|_| anyhow!("{name}={v} is not a non-negative whole number"))
        };
        let rank = number("RANK")?;
        let world = number("WORLD_SIZE")?;
        if world == 0 || rank >= world {
            bail!("RANK={rank} must be below WORLD_SIZE={world}");
        }
        let master_addr = need("MASTER_ADDR")?;
        let port = number("MASTER_PORT")?;
        let master_port =
            u16::try_from(port).map_err(|_| anyhow!("MASTER_PORT={port} is not a TCP port"))?;
        Ok(Some(LaunchEnv {
            rank,
            world,
            local_rank: get("LOCAL_RANK").map_or(Ok(rank), |_| number("LOCAL_RANK"))?,
            master_addr,
            master_port,
        }))
    }

    /// Reads the launch variables of this process.
    pub fn from_env() -> Result<Option<LaunchEnv>> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    fn master(&self) -> Result<SocketAddr> {
        (self.master_addr.as_str(), self.master_port)
            .to_socket_addrs()
            .with_context(|| format!("MASTER_ADDR={} cannot be resolved", self.master_addr))?
            .next()
            .ok_or_else(|| anyhow!("MASTER_ADDR={} has no address", self.master_addr))
    }
}

#[derive(Serialize, Deserialize)]
struct Hello {
    rank: usize,
    world: usize,
    args_hash: u64,
    data_addr: SocketAddr,
}

#[derive(Serialize, Deserialize)]
enum Reply {
    /// Rank 0 took this rank's hello; the table (or the error) follows.
    Welcome,
    Ok {
        peers: Vec<SocketAddr>,
        payload: Vec<u8>,
    },
    Err(String),
}

/// A rank that has met all others.
pub struct Joined {
    pub rank: usize,
    pub world: usize,
    pub local_rank: usize,
    /// Rank 0's payload (empty if it had none).
    pub payload: Vec<u8>,
    /// Every rank's data listener address, by rank.
    pub peers: Vec<SocketAddr>,
    /// This rank's data listener, for the mesh of connections.
    pub listener: TcpListener,
}

fn send_line<T: Serialize>(stream: &mut TcpStream, msg: &T) -> Result<()> {
    let mut line = serde_json::to_vec(msg)?;
    line.push(b'\n');
    stream.write_all(&line)?;
    Ok(())
}

/// One JSON line from `reader` by `deadline`. The reader lives as long as the connection, so a
/// line that arrived with the one before is not lost in a dropped buffer.
fn read_line<T: for<'de> Deserialize<'de>>(
    reader: &mut BufReader<&TcpStream>,
    deadline: Instant,
) -> Result<T> {
    let left = deadline.saturating_duration_since(Instant::now());
    reader
        .get_ref()
        .set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
    let mut line = String::new();
    let n = reader.read_line(&mut line)?;
    if n == 0 {
        bail!("the connection closed");
    }
    Ok(serde_json::from_str(&line)?)
}

/// Meets the other ranks. `args_hash` must be equal on all ranks (same command line);
/// `make_payload` runs on rank 0 only, after every rank has arrived.
pub fn join(
    env: &LaunchEnv,
    args_hash: u64,
    timeout: Duration,
    make_payload: impl FnOnce() -> Result<Vec<u8>>,
) -> Result<Joined> {
    let deadline = Instant::now() + timeout;
    let master = env.master()?;
    if env.rank == 0 {
        let listener = TcpListener::bind(master).map_err(|e| match e.kind() {
            ErrorKind::AddrInUse => anyhow!(
                "MASTER_PORT {} on {} is already in use (another job?); choose another port",
                env.master_port,
                env.master_addr
            ),
            _ => anyhow!(
                "rank 0 cannot listen on MASTER_ADDR={} ({master}: {e}): give an address of rank 0's own machine, such as 127.0.0.1 for a single node",
                env.master_addr
            ),
        })?;
        let data = TcpListener::bind((master.ip(), 0))?;
        lead(
            env,
            args_hash,
            deadline,
            timeout,
            &listener,
            data,
            make_payload,
        )
    } else {
        follow(env, args_hash, deadline, timeout, master)
    }
}

fn lead(
    env: &LaunchEnv,
    args_hash: u64,
    deadline: Instant,
    timeout: Duration,
    listener: &TcpListener,
    data: TcpListener,
    make_payload: impl FnOnce() -> Result<Vec<u8>>,
) -> Result<Joined> {
    listener.set_nonblocking(true)?;
    let mut peers: Vec<Option<(TcpStream, SocketAddr)>> = (0..env.world).map(|_| None).collect();
    let mut rejected = Vec::new(); // connections that only get told why the job stops
    let mut arrived = 1;
    let mut problem = None;
    while arrived < env.world && problem.is_none() {
        match listener.accept() {
            Ok((mut stream, _)) => {
                stream.set_nonblocking(false)?;
                let hello: Hello = match read_line(&mut BufReader::new(&stream), deadline) {
                    Ok(h) => h,
                    Err(_) => continue, // not one of ours, or it died while saying hello
                };
                problem = check_hello(env, args_hash, &hello, &peers);
                if problem.is_none() && send_line(&mut stream, &Reply::Welcome).is_ok() {
                    peers[hello.rank] = Some((stream, hello.data_addr));
                    arrived += 1;
                } else {
                    rejected.push(stream);
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing: Vec<usize> =
                        (1..env.world).filter(|&r| peers[r].is_none()).collect();
                    problem = Some(format!(
                        "rank(s) {missing:?} did not arrive within {:.0} s at {}:{}; check that every rank was started with the same MASTER_ADDR/MASTER_PORT and can reach rank 0",
                        timeout.as_secs_f64(),
                        env.master_addr,
                        env.master_port
                    ));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => problem = Some(format!("rank 0 failed to accept a connection: {e}")),
        }
    }
    let payload = match problem {
        None => make_payload(),
        Some(p) => Err(anyhow!(p)),
    };
    let reply = match &payload {
        Ok(payload) => Reply::Ok {
            peers: std::iter::once(data.local_addr()?)
                .chain(
                    peers
                        .iter()
                        .skip(1)
                        .map(|p| p.as_ref().expect("all arrived").1),
                )
                .collect(),
            payload: payload.clone(),
        },
        Err(e) => Reply::Err(format!("{e:#}")),
    };
    let everyone = peers
        .iter_mut()
        .flatten()
        .map(|(s, _)| s)
        .chain(rejected.iter_mut());
    for stream in everyone {
        // A rank that already left will learn nothing more from us.
        let _ = send_line(stream, &reply);
    }
    joined(env, reply, data)
}

/// The first problem with a rank's hello, as the sentence every rank will print.
fn check_hello(
    env: &LaunchEnv,
    args_hash: u64,
    hello: &Hello,
    peers: &[Option<(TcpStream, SocketAddr)>],
) -> Option<String> {
    if hello.world != env.world {
        Some(format!(
            "rank {} was started with WORLD_SIZE={} but rank 0 with WORLD_SIZE={}; start every rank with the same world size",
            hello.rank, hello.world, env.world
        ))
    } else if hello.rank == 0 || hello.rank >= env.world || peers[hello.rank].is_some() {
        Some(format!(
            "two processes claim RANK={}; give every process its own rank in 0..{}",
            hello.rank, env.world
        ))
    } else if hello.args_hash != args_hash {
        Some(format!(
            "rank {} was started with different arguments than rank 0; start every rank with the same command",
            hello.rank
        ))
    } else {
        None
    }
}

fn follow(
    env: &LaunchEnv,
    args_hash: u64,
    deadline: Instant,
    timeout: Duration,
    master: SocketAddr,
) -> Result<Joined> {
    let mut stream = loop {
        match TcpStream::connect_timeout(&master, Duration::from_millis(500)) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => {
                return Err(Error::timeout(format!(
                    "rank 0 at {}:{} did not answer within {:.0} s ({e}); is it running and reachable?",
                    env.master_addr,
                    env.master_port,
                    timeout.as_secs_f64()
                )));
            }
        }
    };
    let data = TcpListener::bind((stream.local_addr()?.ip(), 0))?;
    let hello = Hello {
        rank: env.rank,
        world: env.world,
        args_hash,
        data_addr: data.local_addr()?,
    };
    send_line(&mut stream, &hello)?;
    let mut reader = BufReader::new(&stream);
    // Rank 0 acknowledges a hello at once; anything else listening there never does.
    let first = deadline.max(Instant::now() + Duration::from_secs(1));
    let reply = match read_line(&mut reader, first) {
        Ok(Reply::Welcome) => {
            // Rank 0 answers once everyone arrived or its own deadline passed: allow for its
            // later start.
            read_line(&mut reader, deadline + timeout).map_err(|e| {
                anyhow!("rank 0 did not complete the rendezvous ({e}); did it fail?")
            })?
        }
        Ok(reply) => reply,
        Err(e) => {
            return Err(Error::timeout(format!(
                "the program listening at MASTER_ADDR={} MASTER_PORT={} did not answer as distflash rank 0 within {:.0} s ({e}); if another program holds that port, choose another MASTER_PORT",
                env.master_addr,
                env.master_port,
                timeout.as_secs_f64()
            )));
        }
    };
    joined(env, reply, data)
}

/// What rank 0's reply means for this rank: the job's table, or the sentence that ends it.
fn joined(env: &LaunchEnv, reply: Reply, listener: TcpListener) -> Result<Joined> {
    match reply {
        Reply::Ok { peers, payload } => Ok(Joined {
            rank: env.rank,
            world: env.world,
            local_rank: env.local_rank,
            payload,
            peers,
            listener,
        }),
        Reply::Err(e) => bail!("{e}"),
        Reply::Welcome => bail!("rank 0 acknowledged this rank twice: a distflash bug"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn reads_torchrun_variables_and_names_what_is_missing() {
        assert_eq!(LaunchEnv::from_vars(vars(&[])).unwrap(), None);
        let full = [
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
        ];
        let env = LaunchEnv::from_vars(vars(&full)).unwrap().unwrap();
        assert_eq!(
            (env.rank, env.world, env.local_rank, env.master_port),
            (1, 2, 1, 29500)
        );
        let err = LaunchEnv::from_vars(vars(&full[..1]))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("WORLD_SIZE is not set but RANK is:"),
            "{err}"
        );
        let err = LaunchEnv::from_vars(vars(&full[..2])).unwrap_err();
        assert!(err.to_string().contains("MASTER_ADDR is not set"), "{err}");
        let err = LaunchEnv::from_vars(vars(&[("RANK", "2"), ("WORLD_SIZE", "2")])).unwrap_err();
        assert!(
            err.to_string().contains("must be below WORLD_SIZE"),
            "{err}"
        );
        let bad_port = [full[0], full[1], full[2], ("MASTER_PORT", "70000")];
        assert!(LaunchEnv::from_vars(vars(&bad_port)).is_err());
    }

    #[test]
    fn a_rank_0_that_never_answers_is_a_timeout() {
        use crate::error::{ErrorKind, kind_of};
        // A port nobody listens on: bound, then let go.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let env = LaunchEnv {
            rank: 1,
            world: 2,
            local_rank: 1,
            master_addr: "127.0.0.1".into(),
            master_port: port,
        };
        let e = join(&env, 0, Duration::from_millis(200), || Ok(Vec::new()))
            .err()
            .expect("nobody answers");
        assert_eq!(kind_of(&e), Some(ErrorKind::Timeout), "{e:#}");
        assert!(
            format!("{e:#}").starts_with(&format!(
                "rank 0 at 127.0.0.1:{port} did not answer within 0 s ("
            )),
            "{e:#}"
        );
    }
}
