//! Devices that run the block math. `exec` drives any `Backend` through the same calls, so a
//! schedule checked on the CPU runs unchanged on a GPU.

mod api;
pub mod cpu;
pub mod cuda;

pub use api::{Backend, ModelEdge, Order};
