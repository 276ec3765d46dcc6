//! The attention mask as the kernels read it (`kernels/common.cuh`): `row_start[q]`, where
//! query position q starts seeing local keys (its document's start or q + 1 − W, whichever is
//! later), one int32 per absolute position, and the count of global prefix tokens. Key k is
//! visible to query q iff k ≤ q and (k ≥ row_start[q] or k < global). The backward, which walks
//! the queries of a key tile, also reads `row_end[k]`: one past the last query whose row starts
//! at or before k. Plain causal attention passes null arrays, and the kernels take their causal
//! path.
//!
//! The array is uploaded once per mask and kept (one mask at a time: a training run or a
//! schedule uses one), so the block API, called many times per step, does not copy it again.

use crate::block_math::Block;
use crate::shape::Mask;
use anyhow::{Result, bail};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, LaunchArgs, PushKernelArg};
use rayon::prelude::*;
use std::sync::{Arc, Mutex};

/// `row_start` of positions `0..len`: where each query's local keys begin.
pub(super) fn row_starts(mask: &Mask, len: usize) -> Result<Vec<i32>> {
    let too_big = |what: &str, v: usize| {
        anyhow::anyhow!("{what} {v} does not fit the kernels' 32-bit positions")
    };
    i32::try_from(len).map_err(|_| too_big("a sequence of", len))?;
    Ok((0..len)
        .into_par_iter()
        .map(|q| mask.visible(q).local.start as i32)
        .collect())
}

/// `row_end` of keys `0..starts.len()` from `row_start` (non-decreasing): the first query whose
/// row starts after the key, or the length when none does.
pub(super) fn row_ends(starts: &[i32]) -> Vec<i32> {
    let mut q = 0;
    (0..starts.len())
        .map(|k| {
            while q < starts.len() && starts[q] as usize <= k {
                q += 1;
            }
            q as i32
        })
        .collect()
}

/// The uploaded `row_start` then `row_end` of one mask, covering positions `0..len`.
struct DeviceMask {
    mask: Mask,
    len: usize,
    rows: Arc<CudaSlice<i32>>,
}

/// The kernels' mask arguments for one launch: the arrays' device pointers (0 for causal) and
/// the global token count. Holds the arrays so they outlive the launch's argument list.
pub(super) struct MaskArgs {
    _rows: Option<Arc<CudaSlice<i32>>>,
    starts: u64,
    ends: u64,
    global: i32,
}

impl MaskArgs {
    /// Pushes the forward kernels' `row_start, global`.
    pub(super) fn push_forward<'a>(&'a self, b: &mut LaunchArgs<'a>) {
        b.arg(&self.starts).arg(&self.global);
    }

    /// Pushes the backward kernels' `row_start, row_end, global`.
    pub(super) fn push_backward<'a>(&'a self, b: &mut LaunchArgs<'a>) {
        b.arg(&self.starts).arg(&self.ends).arg(&self.global);
    }
}

/// The last mask uploaded (one at a time: a training run or a schedule uses one), which the
/// backend in `device` holds.
#[derive(Default)]
pub(super) struct MaskCache(Mutex<Option<DeviceMask>>);

impl MaskCache {
    /// The mask arguments for a launch of `block` on `stream`: causal attention passes none;
    /// another mask uploads its arrays the first time (or when a longer sequence needs more of
    /// them) and reuses them after.
    pub(super) fn args(
        &self,
        stream: &Arc<CudaStream>,
        mask: &Mask,
        block: Block,
    ) -> Result<MaskArgs> {
        if mask.is_causal() {
            return Ok(MaskArgs {
                _rows: None,
                starts: 0,
                ends: 0,
                global: 0,
            });
        }
        let end = block.q.end().max(block.kv.end());
        let docs: usize = mask.doc_lens().iter().sum();
        if docs > 0 && end > docs {
            bail!(
                "the block reaches position {end}, past the {docs} tokens the documents cover: give document lengths that sum to the sequence length"
            );
        }
        let global = i32::try_from(mask.global()).map_err(|_| {
            anyhow::anyhow!(
                "{} global tokens do not fit the kernels' 32-bit positions",
                mask.global()
            )
        })?;
        let mut cached = self
            .0
            .lock()
            .map_err(|_| anyhow::anyhow!("mask cache lock poisoned"))?;
        let (rows, len) = match cached.as_ref() {
            Some(c) if c.mask == *mask && c.len >= end => (c.rows.clone(), c.len),
            _ => {
                // A packed sequence is built whole at once; a window grows with the positions.
                let len = end.max(docs);
                let mut host = row_starts(mask, len)?;
                host.extend(row_ends(&host));
                let rows =
                    Arc::new(stream.clone_htod(&host).map_err(|e| {
                        anyhow::anyhow!("copy of the mask to the GPU failed: {e:?}")
                    })?);
                *cached = Some(DeviceMask {
                    mask: mask.clone(),
                    len,
                    rows: rows.clone(),
                });
                (rows, len)
            }
        };
        let starts = rows.device_ptr(stream).0;
        Ok(MaskArgs {
            _rows: Some(rows),
            starts,
            ends: starts + 4 * len as u64,
            global,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernels' predicate on `row_starts` equals the mask's own visible spans, key by key,
    /// and `row_ends` bounds the queries that see each key locally.
    #[test]
    fn row_starts_and_global_give_the_masks_visible_keys() {
        let seq = 41;
        let masks = [
            Mask::new(seq, &[7, 1, 1, 20, 12], None, 0).unwrap(),
            Mask::new(seq, &[7, 1, 1, 20, 12], Some(5), 3).unwrap(),
            Mask::new(seq, &[], Some(1), 0).unwrap(),
            Mask::new(seq, &[], Some(9), 4).unwrap(),
            Mask::new(seq, &[1; 41], Some(2), 41).unwrap(),
        ];
        for mask in &masks {
            let rs = row_starts(mask, seq).unwrap();
            assert!(rs.windows(2).all(|w| w[0] <= w[1]), "{mask}: not monotone");
            let ends = row_ends(&rs);
            for (k, &end) in ends.iter().enumerate() {
                for (q, &start) in rs.iter().enumerate().skip(k) {
                    assert_eq!(start as usize <= k, q < end as usize, "{mask}: k{k} q{q}");
                }
            }
            let g = mask.global();
            for (q, &start) in rs.iter().enumerate() {
                let v = mask.visible(q);
                for k in 0..seq {
                    let kernel = k <= q && (k as i32 >= start || k < g);
                    let spans = [v.global, v.local]
                        .iter()
                        .any(|s| (s.start..s.end()).contains(&k));
                    assert_eq!(kernel, spans, "{mask}: q{q} k{k}");
                }
            }
        }
    }
}
