//! distflash: exact distributed FlashAttention (DistFlashAttn) for long-context training.
//!
//! The modules follow docs/architecture.md's map: `plan` (schedules), `block_math` (block math and
//! the f64 oracle), `comm` (moving buffers between workers), `exec` (running a plan on a backend) and
//! `backend` (devices). `error` holds the kinds of failure a caller tells apart ([`Error`],
//! [`ErrorKind`]).

pub mod backend;
pub mod block_math;
pub mod comm;
pub mod cpu_rates;
pub mod error;
pub mod exec;
pub mod harness;
pub mod inputs;
pub mod model;
pub mod plan;
pub mod rank_call;
pub mod resources;
pub mod runtime;
pub mod shape;
pub mod sim;
pub mod tensor_file;
pub mod train;

pub use error::{Error, ErrorKind};
