//! Training sequences, each a pure function of its index, so a resumed run sees exactly the
//! sequences the interrupted one would have: the data position is just a count.
//!
//! - `Synthetic`: a long-range recall task. A key marker and a random value are planted in the
//!   first eighth of the sequence; the last eighth asks for it `ASKS` times (a query marker
//!   followed by the value) at random places. Everything else is a counting filler (each token
//!   the successor of the one before, from a random start) that a model learns locally. The
//!   first ask can only be answered by attending from the last worker's chunk back into the
//!   first's; it is the scored probe. The later asks, at random distances from earlier answers,
//!   train the same content-based copying and so give it more signal.
//! - `Bytes`: windows of a file, one token per byte, at offsets drawn from the seed.
//! - `Tokens`: a tokenized corpus (`tokens::TokenFile`: documents joined by end-of-document
//!   tokens) packed into consecutive windows of the sequence length, visited in an order
//!   shuffled by the seed, every window once per epoch.

use super::tokens::TokenFile;
use anyhow::{Context, Result, bail};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::path::Path;

/// Marks the planted value.
pub const KEY: u32 = 1;
/// Asks for the planted value.
pub const QUERY: u32 = 2;
/// Values are tokens `VALUES_FROM..VALUES_FROM + VALUES`.
pub const VALUES_FROM: u32 = 16;
pub const VALUES: u32 = 16;
/// Filler tokens are `FILLER_FROM..vocab`.
pub const FILLER_FROM: u32 = 64;
/// Times the value is asked for at the end of a synthetic sequence (fewer where its last eighth
/// has fewer slots: at the main job's 128 tokens, 8 fill it). The later asks train the copying
/// that the scored first ask needs; with 4 the main job's recall circuit formed within 1000 steps
/// for one initialisation in four, with 8 (and the default rate 5e-3) for seven in seven, at
/// steps 190–502 (bench/train-cpu.md).
pub const ASKS: usize = 8;

/// Where sequences come from.
pub enum Data {
    Synthetic {
        seed: u64,
    },
    Bytes {
        bytes: Vec<u8>,
        name: String,
        seed: u64,
    },
    Tokens {
        file: TokenFile,
        seed: u64,
    },
}

/// One sequence of `seq_len + 1` tokens (inputs are the first `seq_len`, targets the last), the
/// input position whose target is a recall probe, if the task has one, and the token that ends
/// each document packed into it (`None`: no documents, the sequence is one).
pub struct Sample {
    pub tokens: Vec<u32>,
    pub probe: Option<usize>,
    pub eos: Option<u32>,
}

fn rng_for(seed: u64, index: u64) -> StdRng {
    StdRng::seed_from_u64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index)
}

impl Data {
    /// The bytes of `path` as training text.
    pub fn bytes(path: &Path, seed: u64) -> Result<Data> {
        let bytes =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        Ok(Data::Bytes {
            bytes,
            name: path.display().to_string(),
            seed,
        })
    }

    /// Checks that sequences of `seq_len` fit this data and a vocabulary of `vocab`.
    pub fn check(&self, seq_len: usize, vocab: usize) -> Result<()> {
        match self {
            Data::Synthetic { .. } => {
                if vocab < 2 * FILLER_FROM as usize {
                    bail!(
                        "the synthetic task needs a vocabulary of at least {}, the model has {vocab}",
                        2 * FILLER_FROM
                    );
                }
                if seq_len < 16 {
                    bail!("the synthetic task needs --seq-len of at least 16, not {seq_len}");
                }
            }
            Data::Bytes { bytes, name, .. } => {
                if vocab < 256 {
                    bail!(
                        "byte-level data needs a vocabulary of at least 256, the model has {vocab}"
                    );
                }
                if bytes.len() <= seq_len {
                    bail!(
                        "{name} has {} bytes, too few for sequences of {seq_len} tokens",
                        bytes.len()
                    );
                }
            }
            Data::Tokens { file, .. } => {
                if file.max_id() as usize >= vocab {
                    bail!(
                        "{} holds token id {}, outside the model's vocabulary of {vocab}: the tokenizer is not the model's",
                        file.path().display(),
                        file.max_id()
                    );
                }
                if file.len() <= seq_len {
                    bail!(
                        "{} has {} tokens, too few for one sequence of {seq_len}: give more text or a shorter --seq-len",
                        file.path().display(),
                        file.len()
                    );
                }
            }
        }
        Ok(())
    }

    /// Sequence number `index` (of `seq_len` inputs) for a model with `vocab` tokens.
    pub fn sample(&self, index: u64, seq_len: usize, vocab: usize) -> Sample {
        match self {
            Data::Synthetic { seed } => {
                let mut rng = rng_for(*seed, index);
                let span = vocab as u32 - FILLER_FROM;
                let mut filler = rng.random_range(0..span);
                let mut tokens: Vec<u32> = (0..=seq_len)
                    .map(|_| {
                        filler = (filler + 1) % span;
                        FILLER_FROM + filler
                    })
                    .collect();
                let key_at = rng.random_range(0..seq_len / 8);
                let value = VALUES_FROM + rng.random_range(0..VALUES);
                tokens[key_at] = KEY;
                tokens[key_at + 1] = value;
                // Asks at distinct, non-overlapping even offsets of the last eighth; the last
                // input is always one.
                let tail = seq_len - seq_len / 8;
                let slots = (seq_len - tail) / 2;
                let mut asks = vec![seq_len - 1];
                while asks.len() < ASKS.min(slots) {
                    let at = seq_len - 1 - 2 * rng.random_range(1..slots);
                    if !asks.contains(&at) {
                        asks.push(at);
                    }
                }
                for &at in &asks {
                    tokens[at] = QUERY;
                    tokens[at + 1] = value;
                }
                Sample {
                    tokens,
                    probe: asks.iter().min().copied(),
                    eos: None,
                }
            }
            Data::Bytes { bytes, seed, .. } => {
                let mut rng = rng_for(*seed, index);
                let at = rng.random_range(0..bytes.len() - seq_len);
                Sample {
                    tokens: bytes[at..=at + seq_len].iter().map(|&b| b as u32).collect(),
                    probe: None,
                    eos: None,
                }
            }
            Data::Tokens { file, seed } => {
                let window = shuffled_window(index, (file.len() - 1) / seq_len, *seed);
                Sample {
                    tokens: file.tokens(window * seq_len, seq_len + 1),
                    probe: None,
                    eos: Some(file.eos()),
                }
            }
        }
    }

    /// Names the data, so a checkpoint is not resumed on other data by mistake.
    pub fn describe(&self) -> String {
        match self {
            Data::Synthetic { seed } => format!("synthetic recall, seed {seed}"),
            Data::Bytes { bytes, name, seed } => {
                format!("bytes of {name} ({} bytes), seed {seed}", bytes.len())
            }
            Data::Tokens { file, seed } => format!(
                "tokens of {} ({} tokens, {} documents, corpus and tokenizer {:016x}), seed {seed}",
                file.path().display(),
                file.len(),
                file.documents(),
                file.key()
            ),
        }
    }
}

/// Window of sequence `index` among `windows`: epoch `index / windows` visits every window once,
/// in the order of an affine permutation k ↦ (a·k + b) mod windows drawn for the epoch from the
/// seed (a coprime to `windows`, so it is a bijection).
fn shuffled_window(index: u64, windows: usize, seed: u64) -> usize {
    let n = windows as u64;
    let (epoch, k) = (index / n, index % n);
    let mut rng = rng_for(seed ^ 0x5EED, epoch);
    let a = loop {
        let a = rng.random_range(1..n.max(2));
        if gcd(a, n) == 1 {
            break a;
        }
    };
    let b = rng.random_range(0..n);
    ((a as u128 * k as u128 + b as u128) % n as u128) as usize
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_plants_the_value_early_and_asks_for_it_last() {
        let data = Data::Synthetic { seed: 3 };
        let s = data.sample(7, 256, 512);
        assert_eq!(s.tokens.len(), 257);
        let key = s.tokens.iter().position(|&t| t == KEY).unwrap();
        assert!(key < 32);
        assert_eq!(s.tokens[key + 1], s.tokens[256]);
        assert_eq!(s.tokens[255], QUERY);
        let asks: Vec<usize> = (0..256).filter(|&i| s.tokens[i] == QUERY).collect();
        assert_eq!(asks.len(), ASKS);
        assert_eq!(s.probe, Some(asks[0]));
        assert!(asks[0] >= 224 && asks.iter().all(|&a| s.tokens[a + 1] == s.tokens[256]));
        assert_eq!(data.sample(7, 256, 512).tokens, s.tokens);
        assert!(data.check(256, 100).is_err());
    }

    #[test]
    fn a_short_sequence_fills_its_last_eighth_with_asks() {
        // 128 tokens (the main job): the last eighth has 8 ask slots, and ASKS fills them all,
        // so only the first (the probe) is long-range.
        let s = Data::Synthetic { seed: 0 }.sample(5, 128, 256);
        let asks: Vec<usize> = (0..128).filter(|&i| s.tokens[i] == QUERY).collect();
        assert_eq!(asks, (113..128).step_by(2).collect::<Vec<_>>());
        assert_eq!(s.probe, Some(113));
    }

    #[test]
    fn every_window_is_visited_once_an_epoch_in_a_seeded_order() {
        for windows in [1, 2, 7, 12, 30] {
            for epoch in 0..3u64 {
                let mut seen: Vec<usize> = (0..windows as u64)
                    .map(|k| shuffled_window(epoch * windows as u64 + k, windows, 9))
                    .collect();
                seen.sort();
                assert_eq!(seen, (0..windows).collect::<Vec<_>>(), "{windows} {epoch}");
            }
        }
        let order = |seed| {
            (0..30)
                .map(|i| shuffled_window(i, 30, seed))
                .collect::<Vec<_>>()
        };
        assert_eq!(order(1), order(1));
        assert_ne!(order(1), order(2));
    }
}
