//! Text made into training tokens once: a corpus (JSON lines with a `text` field, one document
//! each; any other file is one document) is tokenized by a Hugging Face `tokenizer.json` on all
//! cores, every document followed by the end-of-document token, into a token file beside the
//! corpus that later runs memory-map instead of tokenizing again. The file also keeps where each
//! document ends, for masks at document boundaries.
//!
//! Layout (little-endian): the header (magic, version, the hashes and sizes that decide whether
//! the file still describes the corpus and the tokenizer, the end-of-document id, the largest
//! id, the token and document counts), then the tokens as `u32`, then each document's end (the
//! index after its end-of-document token) as `u64`.

use super::parquet_docs;
use anyhow::{Context, Result, anyhow, bail};
use indicatif::{ProgressBar, ProgressStyle};
use memmap2::Mmap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use tokenizers::Tokenizer;

const MAGIC: &[u8; 8] = b"DFTOKENS";
const VERSION: u64 = 1;
/// Header fields after the magic, each a `u64`.
const FIELDS: usize = 8;
const HEADER_BYTES: usize = 8 + 8 * FIELDS;
/// Documents tokenized per batch (one progress tick each).
const BATCH: usize = 256;
/// End-of-document tokens of the common tokenizers, tried in order when none is named.
const EOS_NAMES: &[&str] = &[
    "</s>",
    "<|end_of_text|>",
    "<|endoftext|>",
    "<eos>",
    "<|im_end|>",
];

/// A corpus's tokens, memory-mapped.
pub struct TokenFile {
    map: Mmap,
    path: PathBuf,
    tokens: usize,
    documents: usize,
    max_id: u32,
    /// The corpus and tokenizer it was made from.
    id: Identity,
}

/// What decides whether a token file still describes its corpus and tokenizer.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Identity {
    tokenizer: u64,
    corpus: u64,
    corpus_len: u64,
    eos: u32,
}

/// FNV-1a, 64 bits: a stable hash of file contents (the standard library's is not stable across
/// releases, and a token file outlives a build).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl TokenFile {
    /// The tokens of `corpus` under `tokenizer`: read from the token file beside the corpus if
    /// it describes both, else tokenized now and written there. `eos` names the end-of-document
    /// token (a token or an id); without it the tokenizer's is looked up by its usual names.
    pub fn open(corpus: &Path, tokenizer: &Path, eos: Option<&str>) -> Result<TokenFile> {
        let tok_bytes = std::fs::read(tokenizer)
            .with_context(|| format!("cannot read the tokenizer {}", tokenizer.display()))?;
        let tok = Tokenizer::from_bytes(&tok_bytes).map_err(|e| {
            anyhow!(
                "{} is not a Hugging Face tokenizer.json: {e}",
                tokenizer.display()
            )
        })?;
        let eos = end_of_document(&tok, eos, tokenizer)?;
        let text = std::fs::read(corpus)
            .with_context(|| format!("cannot read the data {}", corpus.display()))?;
        let id = Identity {
            tokenizer: fnv1a(&tok_bytes),
            corpus: fnv1a(&text),
            corpus_len: text.len() as u64,
            eos,
        };
        let path = cache_path(corpus, id);
        if let Ok(file) = TokenFile::map(&path)
            && file.id == id
        {
            return Ok(file);
        }
        let documents = documents(corpus, &text)?;
        write(&path, &tok, &documents, id)?;
        TokenFile::map(&path)
    }

    /// Maps a token file and checks its header against its length.
    fn map(path: &Path) -> Result<TokenFile> {
        let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        // SAFETY: token files are written whole under a temporary name and renamed into place,
        // never modified after; the map is read-only. A process truncating the file under us
        // would break that, as it would for any reader of a memory-mapped file.
        let map = unsafe { Mmap::map(&file) }
            .with_context(|| format!("cannot map {}", path.display()))?;
        let corrupt = || {
            anyhow!(
                "{} is not a complete token file: delete it to tokenize again",
                path.display()
            )
        };
        if map.len() < HEADER_BYTES || &map[..8] != MAGIC {
            return Err(corrupt());
        }
        let field = |i: usize| {
            let at = 8 + 8 * i;
            u64::from_le_bytes(map[at..at + 8].try_into().expect("8 bytes"))
        };
        if field(0) != VERSION {
            return Err(corrupt());
        }
        let (tokens, documents) = (field(6) as usize, field(7) as usize);
        if map.len() != HEADER_BYTES + 4 * tokens + 8 * documents {
            return Err(corrupt());
        }
        let id = Identity {
            tokenizer: field(1),
            corpus: field(2),
            corpus_len: field(3),
            eos: field(4) as u32,
        };
        Ok(TokenFile {
            path: path.to_path_buf(),
            tokens,
            documents,
            max_id: field(5) as u32,
            id,
            map,
        })
    }

    /// Tokens in the corpus, end-of-document tokens included.
    pub fn len(&self) -> usize {
        self.tokens
    }

    pub fn is_empty(&self) -> bool {
        self.tokens == 0
    }

    pub fn documents(&self) -> usize {
        self.documents
    }

    pub fn eos(&self) -> u32 {
        self.id.eos
    }

    /// The largest token id in the corpus (every id must be below the model's vocabulary).
    pub fn max_id(&self) -> u32 {
        self.max_id
    }

    /// A hash of corpus and tokenizer together: a checkpoint resumes only on the same tokens.
    pub fn key(&self) -> u64 {
        self.id.tokenizer ^ self.id.corpus.rotate_left(1)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Tokens `start..start + len`.
    pub fn tokens(&self, start: usize, len: usize) -> Vec<u32> {
        let bytes = &self.map[HEADER_BYTES + 4 * start..HEADER_BYTES + 4 * (start + len)];
        bytes
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect()
    }

    /// Where each document ends: the index after its end-of-document token.
    pub fn document_ends(&self) -> Vec<u64> {
        let at = HEADER_BYTES + 4 * self.tokens;
        self.map[at..at + 8 * self.documents]
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect()
    }
}

/// The end-of-document id: `named` (an id or a token), else the first of the usual names the
/// tokenizer knows.
fn end_of_document(tok: &Tokenizer, named: Option<&str>, path: &Path) -> Result<u32> {
    if let Some(name) = named {
        if let Ok(id) = name.parse::<u32>() {
            if id as usize >= tok.get_vocab_size(true) {
                bail!(
                    "--eos-token {id} is outside the tokenizer's {} ids",
                    tok.get_vocab_size(true)
                );
            }
            return Ok(id);
        }
        return tok
            .token_to_id(name)
            .with_context(|| format!("the tokenizer {} has no token '{name}'", path.display()));
    }
    EOS_NAMES
        .iter()
        .find_map(|n| tok.token_to_id(n))
        .with_context(|| {
            format!(
                "the tokenizer {} has none of the usual end-of-document tokens ({}): name one with --eos-token",
                path.display(),
                EOS_NAMES.join(", ")
            )
        })
}

/// The token file of `corpus` under `id`: beside it, named by the tokenizer's hash.
fn cache_path(corpus: &Path, id: Identity) -> PathBuf {
    let name = corpus
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "data".into());
    corpus.with_file_name(format!("{name}.{:016x}.tokens", id.tokenizer))
}

/// The documents of a corpus: one per row of a Parquet file or per line of JSON lines (their
/// `text`), else the whole file.
fn documents(corpus: &Path, text: &[u8]) -> Result<Vec<String>> {
    if corpus.extension().is_some_and(|e| e == "parquet") {
        return parquet_docs::documents(corpus);
    }
    let text = std::str::from_utf8(text)
        .map_err(|e| anyhow!("{} is not UTF-8 text: {e}", corpus.display()))?;
    let jsonl = corpus
        .extension()
        .is_some_and(|e| e == "jsonl" || e == "ndjson");
    if !jsonl {
        if text.trim().is_empty() {
            bail!(
                "{} is empty: there is nothing to train on",
                corpus.display()
            );
        }
        return Ok(vec![text.to_string()]);
    }
    let mut docs = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{} line {}: not a JSON object", corpus.display(), n + 1))?;
        let doc = v.get("text").and_then(|t| t.as_str()).with_context(|| {
            format!(
                "{} line {}: no string field 'text' (each line is one document's JSON object)",
                corpus.display(),
                n + 1
            )
        })?;
        docs.push(doc.to_string());
    }
    if docs.is_empty() {
        bail!(
            "{} has no documents: there is nothing to train on",
            corpus.display()
        );
    }
    Ok(docs)
}

/// Tokenizes `docs` in batches on all cores (a progress bar on standard error) and writes the
/// token file at `path` whole, under a temporary name renamed into place.
fn write(path: &Path, tok: &Tokenizer, docs: &[String], id: Identity) -> Result<()> {
    let bar = ProgressBar::new(docs.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("tokenizing {pos}/{len} documents [{bar:30}] {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let mut tokens: Vec<u32> = Vec::new();
    let mut ends: Vec<u64> = Vec::with_capacity(docs.len());
    for batch in docs.chunks(BATCH) {
        let encoded = tok
            .encode_batch(batch.to_vec(), false)
            .map_err(|e| anyhow!("the tokenizer failed: {e}"))?;
        for e in encoded {
            tokens.extend_from_slice(e.get_ids());
            tokens.push(id.eos);
            ends.push(tokens.len() as u64);
        }
        bar.inc(batch.len() as u64);
    }
    bar.finish_and_clear();
    let max_id = tokens.iter().copied().max().unwrap_or(0);
    let tmp = path.with_extension("tokens.partial");
    let cannot = || format!("cannot write the token file {}", path.display());
    let mut out = BufWriter::new(File::create(&tmp).with_context(cannot)?);
    out.write_all(MAGIC).with_context(cannot)?;
    for field in [
        VERSION,
        id.tokenizer,
        id.corpus,
        id.corpus_len,
        id.eos as u64,
        max_id as u64,
        tokens.len() as u64,
        ends.len() as u64,
    ] {
        out.write_all(&field.to_le_bytes()).with_context(cannot)?;
    }
    for t in &tokens {
        out.write_all(&t.to_le_bytes()).with_context(cannot)?;
    }
    for e in &ends {
        out.write_all(&e.to_le_bytes()).with_context(cannot)?;
    }
    out.into_inner()
        .map_err(|e| e.into_error())
        .and_then(|f| f.sync_all())
        .with_context(cannot)?;
    std::fs::rename(&tmp, path).with_context(cannot)
}
