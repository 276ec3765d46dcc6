//! Training on real text: a tokenizer built here with the `tokenizers` crate's trainer on a
//! snapshot of the repository's own README, a JSON-lines (or Parquet) corpus of its paragraphs,
//! tokenized once into a token file that later runs reuse; a model folder fine-tuned on it
//! (`--init-from`) lowers the training and held-out loss, and a resumed run
//! continues the same stream.

mod common;

use common::{distflash, temp_dir};
use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use tokenizers::models::TrainerWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::whitespace::Whitespace;
use tokenizers::{AddedToken, Tokenizer};

/// The corpus: a snapshot of this repository's README (`tests/data/corpus.md`), fixed so that
/// editing the README does not move the losses the tests expect to fall.
fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/corpus.md")).unwrap()
}

/// A 200-token BPE vocabulary (it fits the tiny preset's 256) with `</s>`, trained on the corpus.
fn tokenizer(dir: &Path) -> PathBuf {
    let mut tk = Tokenizer::new(BPE::default());
    tk.with_pre_tokenizer(Some(Whitespace {}));
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(200)
        .special_tokens(vec![AddedToken::from("</s>", true)])
        .build()
        .into();
    let source = dir.join("readme.txt");
    std::fs::write(&source, readme()).unwrap();
    tk.train_from_files(&mut trainer, vec![source.display().to_string()])
        .unwrap();
    let path = dir.join("tokenizer.json");
    tk.save(&path, false).unwrap();
    path
}

/// The corpus's paragraphs, one JSON-lines document each: every fifth held out (`held.jsonl`),
/// the rest to train on (`corpus.jsonl`).
fn corpus(dir: &Path) -> PathBuf {
    let lines: Vec<String> = readme()
        .split("\n\n")
        .filter(|p| p.trim().len() > 20)
        .map(|p| serde_json::json!({ "text": p }).to_string())
        .collect();
    let (held, train): (Vec<_>, Vec<_>) = lines.iter().enumerate().partition(|(i, _)| i % 5 == 4);
    let join = |part: Vec<(usize, &String)>| {
        part.into_iter()
            .map(|(_, l)| l.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    };
    std::fs::write(dir.join("held.jsonl"), join(held)).unwrap();
    let path = dir.join("corpus.jsonl");
    std::fs::write(&path, join(train)).unwrap();
    path
}

fn losses(out: &Output) -> Vec<f64> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["loss"].as_f64())
        .collect()
}

/// `train --json` of `steps` steps on `data` under the tokenizer `tk`: sequences of 64 tokens, 4
/// a step, a peak rate of 1e-2 after 5 warm-up steps, and `extra`.
fn train_text((tk, data): (&str, &str), steps: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "train",
        "--tokenizer",
        tk,
        "--data",
        data,
        "--seq-len",
        "64",
        "--batch",
        "4",
        "--lr",
        "1e-2",
        "--warmup",
        "5",
        "--json",
        "--steps",
        steps,
    ];
    args.extend_from_slice(extra);
    distflash(&args)
}

#[test]
fn fine_tunes_a_model_folder_on_tokenized_text_and_resumes_the_same_stream() {
    let dir = temp_dir("tokens", "train");
    let (tk, data) = (tokenizer(&dir), corpus(&dir));
    let (tk, data) = (tk.to_str().unwrap(), data.to_str().unwrap());
    let save = dir.join("run");
    // The model folder a fine-tune starts from (config.json, model.safetensors and the
    // tokenizer beside them, as a Hugging Face folder holds them): one step of `tiny`, saved.
    let base = dir.join("base");
    let b = base.to_str().unwrap();
    let made = train_text((tk, data), "1", &["--workers", "2", "--save-dir", b]);
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    std::fs::copy(tk, base.join("tokenizer.json")).unwrap();
    let tk = base.join("tokenizer.json");
    let tk = tk.to_str().unwrap();
    let run = |steps: &str, extra: &[&str]| {
        train_text(
            (tk, data),
            steps,
            &[&["--workers", "2", "--init-from", b], extra].concat(),
        )
    };
    let held = dir.join("held.jsonl");
    let eval = ["--eval-data", held.to_str().unwrap(), "--eval-every", "10"];
    let out = run("40", &[&eval[..], &["--eval-sequences", "2"]].concat());
    let whole = losses(&out);
    assert_eq!(whole.len(), 40);
    let evals: Vec<(u64, f64)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| Some((v["step"].as_u64()?, v["eval_loss"].as_f64()?)))
        .collect();
    let steps: Vec<u64> = evals.iter().map(|e| e.0).collect();
    assert_eq!(steps, [10, 20, 30, 40], "held-out loss every 10 steps");
    // At this peak rate the tiny model overfits the small corpus after about 20 steps, so the
    // held-out loss falls, then climbs back toward its first value (at step 40 it ended 0.013
    // under it, and a change of f32 rounding in attention put it 0.04 over): its lowest later
    // value is what shows that it learned.
    let lowest = evals[1..].iter().map(|e| e.1).fold(f64::INFINITY, f64::min);
    assert!(
        lowest < evals[0].1 - 0.05,
        "the held-out loss should fall: {evals:?}"
    );
    // From about ln 200 (uniform over the vocabulary) by more than 0.4 nats, averaged over 5 steps.
    let mean = |l: &[f64]| l.iter().sum::<f64>() / l.len() as f64;
    let (first, last) = (mean(&whole[..5]), mean(&whole[35..]));
    assert!(last < first - 0.4, "the loss should fall: {whole:?}");
    let token_files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with("corpus.jsonl.") && name.ends_with(".tokens")
        })
        .collect();
    assert_eq!(token_files.len(), 1, "one token file beside the corpus");
    let written = token_files[0].metadata().unwrap().modified().unwrap();

    let s = save.to_str().unwrap();
    let part = losses(&run("3", &["--save-dir", s, "--save-every", "3"]));
    // The checkpoint holds the weights and names the model: no --init-from.
    let rest = losses(&train_text(
        (tk, data),
        "6",
        &["--workers", "2", "--resume", s],
    ));
    let straight = losses(&run("6", &[]));
    assert_eq!(
        [part, rest].concat(),
        straight,
        "resume continues the same windows"
    );
    // Later runs read the token file instead of tokenizing again.
    assert_eq!(
        token_files[0].metadata().unwrap().modified().unwrap(),
        written
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bad_text_or_tokenizer_gets_a_sentence() {
    let dir = temp_dir("tokens", "bad");
    let tk = tokenizer(&dir);
    let tk = tk.to_str().unwrap();
    let bad = dir.join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"text\": \"fine\"}\n{\"body\": \"no text field\"}\n",
    )
    .unwrap();
    let cases: [(Vec<&str>, &str); 4] = [
        (
            vec!["train", "--tokenizer", tk, "--data", bad.to_str().unwrap()],
            "line 2: no string field 'text'",
        ),
        (
            vec![
                "train",
                "--tokenizer",
                tk,
                "--data",
                bad.to_str().unwrap(),
                "--eos-token",
                "<nope>",
            ],
            "has no token '<nope>'",
        ),
        (
            vec!["train", "--tokenizer", tk],
            "--tokenizer tokenizes --data",
        ),
        (
            vec![
                "train",
                "--tokenizer",
                "README.md",
                "--data",
                bad.to_str().unwrap(),
            ],
            "is not a Hugging Face tokenizer.json",
        ),
    ];
    for (args, words) in cases {
        let out = distflash(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(words), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn the_token_file_keeps_every_document_and_its_end() {
    use distflash::train::tokens::TokenFile;
    let dir = temp_dir("tokens", "file");
    let (tk, data) = (tokenizer(&dir), corpus(&dir));
    let file = TokenFile::open(&data, &tk, None).unwrap();
    let lines = std::fs::read_to_string(&data).unwrap().lines().count();
    let ends = file.document_ends();
    assert_eq!((ends.len(), file.documents()), (lines, lines));
    assert_eq!(*ends.last().unwrap() as usize, file.len());
    // Each document ends with the end-of-document token, and only there.
    let tokens = file.tokens(0, file.len());
    for &end in &ends {
        assert_eq!(tokens[end as usize - 1], file.eos());
    }
    assert_eq!(
        tokens.iter().filter(|&&t| t == file.eos()).count(),
        ends.len()
    );
    // Opened again, the same file: the tokens are not recomputed.
    let again = TokenFile::open(&data, &tk, Some("</s>")).unwrap();
    assert_eq!((again.key(), again.len()), (file.key(), file.len()));
    std::fs::remove_dir_all(dir).unwrap();
}

/// Writes `rows` as a Parquet file of the one-column schema `message`, two rows a row group (so
/// a reader must go past the first), pages compressed with `codec`.
fn write_parquet(path: &Path, message: &str, rows: &[&str], codec: Compression) {
    let schema = Arc::new(parse_message_type(message).unwrap());
    let props = Arc::new(WriterProperties::builder().set_compression(codec).build());
    let file = std::fs::File::create(path).unwrap();
    let mut writer = SerializedFileWriter::new(file, schema, props).unwrap();
    for group in rows.chunks(2) {
        let mut rg = writer.next_row_group().unwrap();
        let mut col = rg.next_column().unwrap().unwrap();
        let values: Vec<ByteArray> = group.iter().map(|s| ByteArray::from(*s)).collect();
        col.typed::<ByteArrayType>()
            .write_batch(&values, None, None)
            .unwrap();
        col.close().unwrap();
        rg.close().unwrap();
    }
    writer.close().unwrap();
}

/// A Parquet corpus (its `text` column, Snappy-compressed or not) gives the tokens of the same
/// documents as JSON lines: the same documents, in order, each with its end.
#[test]
fn a_parquet_corpus_gives_the_tokens_of_the_same_json_lines() {
    use distflash::train::tokens::TokenFile;
    let dir = temp_dir("tokens", "parquet");
    let (tk, data) = (tokenizer(&dir), corpus(&dir));
    let want = TokenFile::open(&data, &tk, None).unwrap();
    let text = std::fs::read_to_string(&data).unwrap();
    let docs: Vec<String> = text
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let docs: Vec<&str> = docs.iter().map(String::as_str).collect();
    for (name, codec) in [
        ("snappy", Compression::SNAPPY),
        ("plain", Compression::UNCOMPRESSED),
    ] {
        let path = dir.join(format!("corpus-{name}.parquet"));
        write_parquet(
            &path,
            "message schema { REQUIRED BYTE_ARRAY text (UTF8); }",
            &docs,
            codec,
        );
        let got = TokenFile::open(&path, &tk, None).unwrap();
        assert_eq!(got.document_ends(), want.document_ends(), "{name}");
        assert_eq!(
            got.tokens(0, got.len()),
            want.tokens(0, want.len()),
            "{name}"
        );
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_parquet_file_without_a_text_column_of_strings_is_named() {
    use distflash::train::tokens::TokenFile;
    let dir = temp_dir("tokens", "parquet-bad");
    let tk = tokenizer(&dir);
    let path = dir.join("corpus.parquet");
    let err = |message: &str| {
        write_parquet(&path, message, &["a", "b", "c"], Compression::SNAPPY);
        TokenFile::open(&path, &tk, None).err().unwrap().to_string()
    };
    let e = err("message schema { REQUIRED BYTE_ARRAY content (UTF8); }");
    assert!(
        e.contains("has no column 'text' (its columns: content)"),
        "{e}"
    );
    let e = err("message schema { REQUIRED BYTE_ARRAY text; }");
    assert!(e.contains("column 'text' does not hold strings"), "{e}");
    std::fs::write(&path, b"{\"text\": \"json lines, not parquet\"}\n").unwrap();
    let e = TokenFile::open(&path, &tk, None).err().unwrap().to_string();
    assert!(e.contains("is not a readable Parquet file"), "{e}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// With `--documents separate` (positions restarted) a model learns the text, its documents
/// masked off from each other at the `</s>` tokens, and a resumed run continues the same
/// trajectory; the masks change it (the README's paragraphs are shorter than a sequence, so
/// most sequences hold several documents).
#[test]
fn separate_documents_train_on_text_and_resume() {
    let dir = temp_dir("tokens", "documents");
    let (tk, data) = (tokenizer(&dir), corpus(&dir));
    let (tk, data) = (tk.to_str().unwrap(), data.to_str().unwrap());
    let save = dir.join("run");
    let run = |steps: &str, extra: &[&str]| {
        let workers = ["--workers", "3", "--schedule", "zigzag"];
        train_text((tk, data), steps, &[&workers[..], extra].concat())
    };
    let separate = ["--documents", "separate", "--positions", "restart"];
    let held = dir.join("held.jsonl");
    let eval = ["--eval-data", held.to_str().unwrap(), "--eval-every", "30"];
    let out = run(
        "30",
        &[&separate[..], &eval, &["--eval-sequences", "2"]].concat(),
    );
    let whole = losses(&out);
    assert_eq!(whole.len(), 30);
    let evals = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("\"eval_loss\""))
        .count();
    assert_eq!(
        evals, 1,
        "the held-out documents are evaluated, masked alike"
    );
    let mean = |l: &[f64]| l.iter().sum::<f64>() / l.len() as f64;
    let (first, last) = (mean(&whole[..5]), mean(&whole[25..]));
    assert!(last < first - 0.4, "the loss should fall: {whole:?}");
    let s = save.to_str().unwrap();
    let part = losses(&run("3", &[&separate[..], &["--save-dir", s]].concat()));
    let rest = losses(&run("6", &[&separate[..], &["--resume", s]].concat()));
    assert_eq!(
        [part, rest].concat(),
        whole[..6],
        "resume continues the same trajectory"
    );
    let packed = losses(&run("6", &[]));
    assert_ne!(packed, whole[..6], "the masks change the trajectory");
    std::fs::remove_dir_all(dir).unwrap();
}
