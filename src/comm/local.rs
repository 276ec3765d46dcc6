//! The in-process transport: worker threads of one process, one channel inbox each.

use super::endpoint::{Endpoint, Envelope, Transport};
use anyhow::{Result, anyhow};
use std::sync::mpsc::{Sender, channel};
use std::time::Duration;

/// Senders into every worker's inbox.
pub struct Channels {
    peers: Vec<Sender<Envelope>>,
}

impl Transport for Channels {
    fn world(&self) -> usize {
        self.peers.len()
    }

    fn post(&mut self, to: usize, envelope: Envelope) -> Result<()> {
        self.peers[to]
            .send(envelope)
            .map_err(|_| anyhow!("worker {to} has exited"))
    }
}

/// One worker thread's endpoint.
pub type LocalComm = Endpoint<Channels>;

/// Endpoints for `world` workers; a receive waits at most `timeout` for its message.
pub fn local_group(world: usize, timeout: Duration) -> Vec<LocalComm> {
    let (senders, inboxes): (Vec<_>, Vec<_>) = (0..world).map(|_| channel()).unzip();
    inboxes
        .into_iter()
        .enumerate()
        .map(|(rank, inbox)| {
            let transport = Channels {
                peers: senders.clone(),
            };
            Endpoint::new(rank, transport, inbox, timeout)
        })
        .collect()
}
