//! The socket transport: ranks in separate processes (or machines), one TCP connection per pair
//! of ranks. A reader thread per connection turns frames into envelopes in the rank's inbox, so
//! sends never wait for the receiver to be ready.
//!
//! Frame: sender rank (u32), tag (u64), kind (u8: 0 data, 1 abort), then for data a part count
//! (u32) and each part as a length in elements (u64) and little-endian f32 values; for an abort a
//! byte length (u64) and UTF-8 text. All integers little-endian.

use super::endpoint::{Body, Buf, Endpoint, Envelope, Transport};
use super::rendezvous::Joined;
use super::{PeerFailed, Tag};
use anyhow::{Context, Result, anyhow, bail};
use std::io::{BufReader, BufWriter, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::mpsc::{Sender, channel};
use std::time::{Duration, Instant};

/// Writers to every other rank (None at our own index).
pub struct Sockets {
    writers: Vec<Option<BufWriter<TcpStream>>>,
}

impl Transport<Buf> for Sockets {
    fn world(&self) -> usize {
        self.writers.len()
    }

    fn post(&mut self, to: usize, envelope: Envelope<Buf>) -> Result<()> {
        let w = self.writers[to]
            .as_mut()
            .ok_or_else(|| anyhow!("no connection to worker {to}"))?;
        write_frame(w, &envelope)?;
        w.flush()?;
        Ok(())
    }
}

/// A rank's endpoint between processes.
pub type TcpComm = Endpoint<Buf, Sockets>;

fn write_frame(w: &mut impl Write, e: &Envelope<Buf>) -> Result<()> {
    w.write_all(&(e.from as u32).to_le_bytes())?;
    w.write_all(&e.tag.0.to_le_bytes())?;
    match &e.body {
        Body::Data(parts) => {
            w.write_all(&[0])?;
            w.write_all(&(parts.len() as u32).to_le_bytes())?;
            for part in parts {
                w.write_all(&(part.len() as u64).to_le_bytes())?;
                let bytes: Vec<u8> = part.iter().flat_map(|x| x.to_le_bytes()).collect();
                w.write_all(&bytes)?;
            }
        }
        Body::Abort(reason) => {
            w.write_all(&[1])?;
            w.write_all(&(reason.len() as u64).to_le_bytes())?;
            w.write_all(reason.as_bytes())?;
        }
        Body::Closed(_) => bail!("a connection-closed note is local to a rank and never sent"),
        Body::Lent(_) => bail!("a loan of a buffer is local to a process and never sent"),
    }
    Ok(())
}

fn read_array<const N: usize>(r: &mut impl Read) -> std::io::Result<[u8; N]> {
    let mut b = [0; N];
    r.read_exact(&mut b)?;
    Ok(b)
}

fn read_frame(r: &mut impl Read) -> std::io::Result<Envelope<Buf>> {
    let from = u32::from_le_bytes(read_array(r)?) as usize;
    let tag = Tag(u64::from_le_bytes(read_array(r)?));
    let body = match read_array::<1>(r)?[0] {
        0 => {
            let count = u32::from_le_bytes(read_array(r)?);
            let mut parts = Vec::with_capacity(count as usize);
            for _ in 0..count {
                let len = u64::from_le_bytes(read_array(r)?) as usize;
                let mut bytes = vec![0u8; len * 4];
                r.read_exact(&mut bytes)?;
                let part: Buf = bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                parts.push(part);
            }
            Body::Data(parts)
        }
        1 => {
            let len = u64::from_le_bytes(read_array(r)?) as usize;
            let mut text = vec![0u8; len];
            r.read_exact(&mut text)?;
            Body::Abort(String::from_utf8_lossy(&text).into_owned())
        }
        other => {
            return Err(std::io::Error::new(
                ErrorKind::InvalidData,
                format!("unknown frame kind {other}"),
            ));
        }
    };
    Ok(Envelope { from, tag, body })
}

/// Feeds frames from `peer` into the inbox until the connection ends. A connection that ends
/// while the rank still runs is reported as that peer's failure; after a clean finish nobody
/// reads it.
fn pump(stream: TcpStream, peer: usize, inbox: Sender<Envelope<Buf>>) {
    let mut reader = BufReader::with_capacity(1 << 20, stream);
    loop {
        match read_frame(&mut reader) {
            Ok(e) => {
                if inbox.send(e).is_err() {
                    return; // our rank has finished
                }
            }
            Err(e) => {
                let reason = match e.kind() {
                    ErrorKind::UnexpectedEof => "its connection closed".to_string(),
                    _ => format!("its connection broke: {e}"),
                };
                let _ = inbox.send(Envelope {
                    from: peer,
                    tag: Tag(u64::MAX),
                    body: Body::Closed(reason),
                });
                return;
            }
        }
    }
}

/// Connects every pair of ranks: rank r dials each lower rank's listener and accepts one
/// connection from each higher rank, all within `connect_timeout`. Receives on the result wait
/// at most `recv_timeout`.
pub fn connect_mesh(
    joined: Joined,
    connect_timeout: Duration,
    recv_timeout: Duration,
) -> Result<TcpComm> {
    let deadline = Instant::now() + connect_timeout;
    let (me, world) = (joined.rank, joined.world);
    let mut streams: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
    for (peer, addr) in joined.peers.iter().enumerate().take(me) {
        let mut s = loop {
            match TcpStream::connect_timeout(addr, Duration::from_millis(500)) {
                Ok(s) => break s,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => bail!("worker {me} could not connect to worker {peer} at {addr}: {e}"),
            }
        };
        s.write_all(&(me as u32).to_le_bytes())?;
        streams[peer] = Some(s);
    }
    joined.listener.set_nonblocking(true)?;
    while streams
        .iter()
        .enumerate()
        .any(|(r, s)| r > me && s.is_none())
    {
        match joined.listener.accept() {
            Ok((mut s, _)) => {
                s.set_nonblocking(false)?;
                s.set_read_timeout(Some(Duration::from_secs(5)))?;
                let peer = u32::from_le_bytes(read_array(&mut s)?) as usize;
                s.set_read_timeout(None)?;
                if peer <= me || peer >= world || streams[peer].is_some() {
                    bail!("worker {me} got an unexpected connection claiming to be worker {peer}");
                }
                streams[peer] = Some(s);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => {
                let missing: Vec<usize> =
                    (me + 1..world).filter(|&r| streams[r].is_none()).collect();
                return Err(PeerFailed {
                    rank: missing.first().copied().unwrap_or(me),
                    reason: format!("workers {missing:?} never connected to worker {me} ({e})"),
                })
                .context("building the connections between ranks");
            }
        }
    }
    let (tx, inbox) = channel();
    let mut writers = Vec::with_capacity(world);
    for (peer, stream) in streams.into_iter().enumerate() {
        match stream {
            Some(s) => {
                s.set_nodelay(true)?;
                let reader = s.try_clone()?;
                let tx = tx.clone();
                std::thread::spawn(move || pump(reader, peer, tx));
                writers.push(Some(BufWriter::with_capacity(1 << 20, s)));
            }
            None => writers.push(None),
        }
    }
    Ok(Endpoint::new(me, Sockets { writers }, inbox, recv_timeout))
}
