#!/usr/bin/env python3
"""Issue 20's GPU check: fine-tuning a checkpoint that transformers wrote, on tokenized text.

On the GPU machine (no download): trains a BPE tokenizer (Python `tokenizers`, vocabulary 512,
`</s>` as end of document) on the repository's Markdown, splits its paragraphs into JSON lines (every fifth held
out), lets transformers write Llama-3-shaped checkpoints with random bf16 weights
(`rope_scaling` of type llama3, GQA, head dim 128) and runs

    distflash train --device cuda --init-from DIR --tokenizer DIR/tokenizer.json \
        --data corpus.jsonl --eval-data held.jsonl --seq-len N ...

1. `small` (4 layers, hidden 1024): 40 steps uninterrupted, then 20 steps saved and resumed to
   40: the training and held-out losses fall, and the resumed run's steps 21-40 follow the
   uninterrupted run's (the same data stream: the data position is in the checkpoint);
2. `8b` (Llama-3-8B's shape, vocabulary 128256): 12 steps at 4K tokens, losses fall.

    python3 bench/peers/finetune_check.py --bin .dev/distflash --out $OUT/finetune

Writes each run's JSON lines and `finetune.json` (the verdicts) under --out; exits non-zero on a
failed check.
"""
import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Resumed steps may differ from uninterrupted ones by bf16 rounding of atomically summed
# gradients (the kernels' accumulation order varies between runs); a wrong data position
# changes the loss of the first resumed step by far more (a different sequence).
RESUME_TOLERANCE = 2e-2


def repository_markdown():
    """The repository's own Markdown (about 200 KB, 50K tokens at a vocabulary of 512): enough
    for held-out sequences of the 8B run's 4096 tokens."""
    return "\n\n".join(f.read_text() for f in sorted(Path(".").glob("**/*.md"))
                       if "target" not in f.parts and not any(x.startswith(".") for x in f.parts))


def tokenizer_and_data(work, text, vocab):
    """A BPE tokenizer of `vocab` tokens (`</s>` among them) trained on `text`, saved as
    work/tokenizer.json, and the text's paragraphs as JSON lines: every fifth in
    work/held.jsonl, the rest in work/corpus.jsonl. Returns the vocabulary and paragraph count.
    (bench/peers/data_checks.sh calls it too.)"""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=vocab, special_tokens=["</s>"]))
    tok.save(str(work / "tokenizer.json"))
    paras = [json.dumps({"text": p}) for p in text.split("\n\n") if len(p.strip()) > 20]
    (work / "held.jsonl").write_text("\n".join(p for i, p in enumerate(paras) if i % 5 == 4))
    (work / "corpus.jsonl").write_text("\n".join(p for i, p in enumerate(paras) if i % 5 != 4))
    return tok.get_vocab_size(), len(paras)


def write_checkpoint(path, **shape):
    import torch
    import transformers

    cfg = transformers.LlamaConfig(
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        head_dim=128,
        **shape,
    )
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(path)
    del model
    torch.cuda.empty_cache()
    shutil.copy(path.parent / "tokenizer.json", path / "tokenizer.json")
    return json.loads((path / "config.json").read_text())


def train(args, work, model, name, extra, resume=None):
    # A resumed run takes its weights from the checkpoint (distflash refuses --init-from beside it).
    start = ["--resume", str(resume)] if resume else ["--init-from", str(model)]
    cmd = [
        args.bin, "train", "--device", "cuda", *start,
        "--tokenizer", str(model / "tokenizer.json"),
        "--data", str(work / "corpus.jsonl"), "--eval-data", str(work / "held.jsonl"),
        "--json", *extra,
    ]
    print("$", " ".join(cmd), flush=True)
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    (args.out / f"{name}.jsonl").write_text(run.stdout)
    (args.out / f"{name}.stderr").write_text(run.stderr)
    if run.returncode != 0:
        print(run.stderr[-3000:])
        raise SystemExit(f"{name}: exit {run.returncode}")
    lines = [json.loads(l) for l in run.stdout.splitlines() if l.startswith("{")]
    steps = {l["step"]: l for l in lines if "step" in l and "loss" in l}
    summary = lines[-1]
    return steps, summary


def falls(name, steps, summary):
    first, last = steps[min(steps)]["loss"], steps[max(steps)]["loss"]
    ev0, ev1 = summary.get("eval_loss_first"), summary.get("eval_loss_last")
    ok = last < first and ev0 is not None and ev1 is not None and ev1 < ev0
    print(f"{name}: loss {first:.4f} -> {last:.4f}, held-out {ev0} -> {ev1}, "
          f"startup {summary.get('startup_secs')} s: {'PASS' if ok else 'FAIL'}")
    return {"loss_first": first, "loss_last": last, "eval_loss_first": ev0,
            "eval_loss_last": ev1, "startup_secs": summary.get("startup_secs"),
            "step_secs": [s.get("step_secs") for s in steps.values()], "pass": ok}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default=".dev/distflash")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--timeout", type=int, default=300)
    p.add_argument("--skip-8b", action="store_true")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp())
    vocab, docs = tokenizer_and_data(work, repository_markdown(), 512)
    print(f"tokenizer vocabulary {vocab}, {docs} documents", flush=True)
    verdicts = {}

    small = work / "small"
    cfg = write_checkpoint(small, vocab_size=512, hidden_size=1024, intermediate_size=2816,
                           num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2)
    verdicts["small_config_rope"] = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    # A constant rate after the warm-up, so that the 20-step run that is saved and resumed
    # follows the same schedule as the uninterrupted 40 (cosine and linear end at --steps).
    common = ["--seq-len", "1024", "--batch", "2", "--lr", "1e-3", "--warmup", "5",
              "--eval-every", "10", "--eval-sequences", "2", "--save-every", "20"]
    whole, whole_sum = train(args, work, small, "small_40", common + ["--steps", "40"])
    verdicts["small_40"] = falls("small, 40 steps", whole, whole_sum)
    half_dir = work / "saved"
    train(args, work, small, "small_20", common + ["--steps", "20", "--save-dir", str(half_dir)])
    resumed, _ = train(args, work, small, "small_resumed",
                       common + ["--steps", "40"], resume=half_dir)
    diffs = {s: abs(resumed[s]["loss"] - whole[s]["loss"]) / abs(whole[s]["loss"])
             for s in resumed if s in whole}
    verdicts["resume"] = {"steps": sorted(resumed), "largest_relative_difference": max(diffs.values()),
                          "first_resumed_step": min(resumed),
                          "pass": min(resumed) == 21 and max(diffs.values()) < RESUME_TOLERANCE}
    print("resume:", verdicts["resume"])

    if not args.skip_8b:
        big = work / "8b"
        write_checkpoint(big, vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8)
        steps, summary = train(args, work, big, "llama3_8b",
                               ["--seq-len", "4096", "--batch", "1", "--steps", "12", "--lr", "1e-4",
                                "--warmup", "2", "--decay", "cosine", "--eval-every", "6",
                                "--eval-sequences", "1"])
        verdicts["llama3_8b"] = falls("Llama-3-8B shape, 12 steps", steps, summary)
        shutil.rmtree(big)
    (args.out / "finetune.json").write_text(json.dumps(verdicts, indent=1))
    ok = all(v.get("pass", True) for v in verdicts.values() if isinstance(v, dict))
    print("PASSED" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
