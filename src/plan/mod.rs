//! The static schedule of distributed causal attention: at each step, which blocks
//! (query chunk, key/value chunk) every worker computes, and which tensors move between whom.
//!
//! The sequence is cut into chunks of consecutive rows; each chunk (its Q, K, V) belongs to one
//! worker. Block (i, j) is needed for j ≤ i. The schedules offered (docs/architecture.md,
//! "Schedules"):
//! - `unbalanced`: P chunks, worker r owns chunk r. At step t, worker r computes (r, r − t) if
//!   r ≥ t, fetching K/V from worker r − t. Worker P−1 works P steps, worker 0 one.
//! - `balanced` (DistFlashAttn): the same chunks; owners still compute offset t at step t, but a
//!   worker r < t, idle above, helps the worker P − t + r with the far block (P − t + r, r),
//!   using its own K/V and the fetched query chunk, and returns the partial (O, LSE) to be
//!   merged. Offsets t and P − t are covered together, so ⌊P/2⌋ + 1 steps suffice.
//! - `zigzag` (head-tail, as other context-parallel systems use): 2P half-size chunks, worker r
//!   owns chunks r and 2P − 1 − r. At step t every worker computes its queries against the K/V
//!   of worker r − t (mod P): each step gives every worker the same work, two quarter-size blocks
//!   (or three smaller ones at step 0), so P steps make a speedup of P even for P = 2, where
//!   `balanced` reaches only 4/3.
//! - `greedy` (cost-aware, for masks): `balanced`'s chunks and roles, but each block goes to its
//!   query's or its key's owner by its real cost, heaviest first (`greedy.rs`), so the blocks
//!   of a long packed document are shared by the workers holding their keys. Under full
//!   causal attention it takes `balanced`'s ⌊P/2⌋ + 1 steps.
//!
//! The backward pass follows the same tasks; only what travels changes (see `Payload`).
//!
//! Under a mask (`shape::Mask`: packed documents, a sliding window, global tokens) a plan is
//! made from the real work: a block in which the mask hides every pair is neither computed nor
//! fetched (the schedule's task is left out, with the transfers only it needed, and steps left
//! empty go), so with a window no wider than a chunk only neighbouring chunks move (the paper's
//! appendix F); the cost model counts each block's visible pairs.

mod greedy;
mod partition;
mod parts;
mod plans;
mod render;
pub mod volume;

pub use partition::Partition;
pub use parts::{Pass, Payload, Role, Schedule, Step, Task, Transfer};
pub use plans::{Plan, chunk_sizes};
pub use render::{to_json, to_svg, to_text};

#[cfg(test)]
mod tests;
