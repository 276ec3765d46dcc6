//! The `greedy` schedule: blocks assigned by their real cost. Worker r owns chunk r (as in
//! `balanced`); step 0 computes the diagonal; every other block with work in it (i, j), j < i,
//! goes to one of the two workers holding an operand: the query's owner i (fetching K/V) or the
//! key's owner j (a helper, fetching Q and returning the partial). Each later step gives every
//! worker at most one block, like `balanced`, so every step fetches at most one chunk per worker.
//!
//! Steps are filled heaviest block first: each step takes the largest set of remaining blocks
//! that can be given to distinct workers, preferring heavier blocks (augmenting paths, so a block
//! taken stays taken when a later one needs its worker), and the query's owner over a helper.
//! Under full causal attention every off-diagonal block costs the same, and ties go in
//! `balanced`'s order (offsets t and P − t together), which gives its ⌊P/2⌋ + 1 steps. Under a
//! mask the heavy blocks of a long document spread over the workers holding their keys, where
//! `balanced`, assigning by offset, leaves them to their query's owner.

use super::parts::Task;

/// The steps of the greedy schedule for `p` workers, where block (i, j) costs `cost(i, j)`
/// (0: nothing visible, left out).
pub(super) fn steps(p: usize, cost: impl Fn(usize, usize) -> f64) -> Vec<Vec<Task>> {
    let diagonal: Vec<Task> = (0..p)
        .filter(|&r| cost(r, r) > 0.0)
        .map(|r| Task {
            worker: r,
            q_chunk: r,
            kv_chunk: r,
        })
        .collect();
    // Heaviest first; among equals, balanced's order: offset pairs (t, P − t), then rows.
    let pairing = |i: usize, j: usize| {
        let offset = i - j;
        (offset.min(p - offset), offset, i)
    };
    let mut remaining: Vec<(usize, usize)> = (0..p)
        .flat_map(|i| (0..i).map(move |j| (i, j)))
        .filter(|&(i, j)| cost(i, j) > 0.0)
        .collect();
    remaining.sort_by(|&(a, b), &(c, d)| {
        cost(c, d)
            .total_cmp(&cost(a, b))
            .then(pairing(a, b).cmp(&pairing(c, d)))
    });
    let mut steps = vec![diagonal];
    while !remaining.is_empty() {
        let mut by_worker: Vec<Option<(usize, usize)>> = vec![None; p];
        let mut later = Vec::new();
        for block in remaining {
            if !assign(block, &mut by_worker, &mut vec![false; p]) {
                later.push(block);
            }
        }
        let tasks = by_worker
            .iter()
            .enumerate()
            .filter_map(|(worker, b)| {
                b.map(|(q_chunk, kv_chunk)| Task {
                    worker,
                    q_chunk,
                    kv_chunk,
                })
            })
            .collect();
        steps.push(tasks);
        remaining = later;
    }
    steps.retain(|s| !s.is_empty());
    steps
}

/// Gives `block` to its query's owner or its key's owner: a free one if there is (the query's
/// owner first, so no partial has to travel back), else one whose block moves to its other
/// candidate (an augmenting path, tried only then so that blocks stay with their query's owner
/// where they can); false if no assignment takes it.
fn assign(
    block: (usize, usize),
    by_worker: &mut [Option<(usize, usize)>],
    visited: &mut [bool],
) -> bool {
    let candidates = [block.0, block.1];
    if let Some(&free) = candidates
        .iter()
        .find(|&&w| !visited[w] && by_worker[w].is_none())
    {
        by_worker[free] = Some(block);
        return true;
    }
    for worker in candidates {
        if visited[worker] {
            continue;
        }
        visited[worker] = true;
        let held = by_worker[worker].expect("a worker without a block was taken above");
        if assign(held, by_worker, visited) {
            by_worker[worker] = Some(block);
            return true;
        }
    }
    false
}
