//! The in-process transport: worker threads of one process, one channel inbox each.

use super::Buffer;
use super::endpoint::{Endpoint, Envelope, Transport};
use anyhow::{Result, anyhow};
use std::sync::mpsc::{Sender, channel};
use std::time::Duration;

/// Senders into every worker's inbox.
pub struct Channels<B> {
    peers: Vec<Sender<Envelope<B>>>,
}

impl<B> Transport<B> for Channels<B> {
    fn world(&self) -> usize {
        self.peers.len()
    }

    fn post(&mut self, to: usize, envelope: Envelope<B>) -> Result<()> {
        self.peers[to]
            .send(envelope)
            .map_err(|_| anyhow!("worker {to} has exited"))
    }

    /// Worker threads of one process: a peer can read a lent buffer in place.
    fn shares_memory(&self) -> bool {
        true
    }
}

/// One worker thread's endpoint, carrying buffers `B` (host vectors by default).
pub type LocalComm<B = Vec<f32>> = Endpoint<B, Channels<B>>;

/// Endpoints for `world` workers; a receive waits at most `timeout` for its message.
pub fn local_group<B: Buffer>(world: usize, timeout: Duration) -> Vec<LocalComm<B>> {
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
