//! Moving buffers between workers. `exec` speaks only this trait, so the same plan runs over
//! in-process channels (CPU workers as threads) or NCCL (one process per GPU).

mod api;
mod cuda;
mod endpoint;
mod local;
pub mod nccl;
pub mod rendezvous;
mod solo;
mod tcp;

pub use api::{
    Buffer, Communicator, Incoming, Outgoing, PeerFailed, Posted, Role, Shared, Src, Tag, Wire,
    all_gather_bytes, reduce_scatter_bytes, shard_span, shard_spans,
};
use api::{
    check_span, check_tensors, copy_over, gather_by_messages, gather_each, own_span,
    scatter_by_messages,
};
pub use endpoint::{Body, Buf, Endpoint, Envelope, Transport};
pub use local::{LocalComm, local_group};
pub use solo::Solo;
pub use tcp::{TcpComm, connect_mesh};
