"""On the GPU machine: masks through distflash's transformers integration (issue 21), against
transformers' own SDPA.

Tiny random-init models (2 layers, hidden 256, 4 heads of 64, 2 kv heads, vocab 1000), saved
and loaded with `from_pretrained(..., attn_implementation=...)`: each case runs the model in
float32 with "sdpa" (the reference), in bf16 with "sdpa" and in bf16 with "distattn", loss and
backward, `use_cache=False` (with a cache transformers' SDPA mask ignores packing):

  packed          LLaMA, one row of 3 documents marked by position ids restarting at 0 (as
                  DataCollatorWithFlattening makes them); distattn also with the collator's
                  cu_seq_lens_q/k offsets beside the position ids;
  packed_batch2   the same packing in both rows of a batch of 2;
  window          Mistral, sliding_window=W smaller than the sequence, batch 2;
  window_packed   Mistral's window over the packed row.

Pass, per distattn run: loss within 2x SDPA-bf16's error against the reference (plus 1e-3
relative, a quarter of a bf16 ulp, as torch_binding.py's check); the whole gradient within 2x
SDPA-bf16's; every parameter's gradient within 2x the larger of SDPA-bf16's error on it and its
whole-gradient error (a parameter SDPA happens to get unusually close is held to the model's
bf16 level); distflash's kernels called once per layer, each with the mask expected. And the
case can fail: the reference with the mask taken away (no packing, no window) has some
parameter's gradient at least 4x over that bar, so ignoring the mask would not pass.

  decode          Mistral with a window: a cached prefill longer than the window (distflash's
                  kernels) and one decoding step (transformers' SDPA under the mask
                  distflash's mask builder hands on), logits against the float32 reference
                  within 2x SDPA-bf16's error;
  refusals        a padding mask, a batch whose rows pack differently, and the mask builder
                  given a mask function that lets tokens see later ones: a ValueError with the
                  sentence each; the builder hands over no mask for causal and packed ones.

Writes one JSON object to --out, prints a line per check and a last PASSED/FAILED line; exit
status 1 if any check fails.
    python3 bench/peers/hf_mask_parity.py --out $OUT/hf_mask_parity.json
"""
import argparse
import json
import sys
import tempfile

import torch

import distflash.attention
import distflash.transformers
from torch_binding import rel  # beside this script

DIMS = dict(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, max_position_embeddings=4096, attention_dropout=0.0)
DOCS = [700, 389, 447]  # three documents, none a multiple of a kernel tile
SEQ = sum(DOCS)
WINDOW = 200
DEVICE = "cuda"  # one name for every tensor and model (a dry run elsewhere can set it)

CALLS = []  # the mask arguments of every call of distflash's kernels


def record_calls():
    inner = distflash.attention.attend_head_major

    def recorded(*a, **kw):
        CALLS.append({"doc_lens": list(kw.get("doc_lens") or []), "window": kw.get("window")})
        return inner(*a, **kw)

    distflash.attention.attend_head_major = recorded


def packed_positions(batch):
    return torch.cat([torch.arange(n) for n in DOCS]).expand(batch, -1).contiguous().to(DEVICE)


def offsets(batch):
    cu = [0]
    for _ in range(batch):
        for n in DOCS:
            cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=DEVICE)


def tokens(batch, seq, seed=3):
    return torch.randint(0, DIMS["vocab_size"], (batch, seq), device=DEVICE,
                         generator=torch.Generator(device=DEVICE).manual_seed(seed))


def saved(kind, **extra):
    """A random-init model of `kind` saved to a folder (the same weights for every run)."""
    import transformers

    cfg = getattr(transformers, f"{kind}Config")(**DIMS, **extra)
    torch.manual_seed(0)
    path = tempfile.mkdtemp()
    getattr(transformers, f"{kind}ForCausalLM")(cfg).save_pretrained(path)
    return path


def load(path, impl, dtype, **config):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(path)
    for k, v in config.items():
        setattr(cfg, k, v)
    return AutoModelForCausalLM.from_pretrained(path, config=cfg, attn_implementation=impl, dtype=dtype).to(DEVICE)


def loss_and_grads(path, impl, dtype, ids, config=None, **inputs):
    m = load(path, impl, dtype, **(config or {}))
    loss = m(input_ids=ids, labels=ids, use_cache=False, **inputs).loss
    loss.backward()
    grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().float() for n, p in m.named_parameters()}
    return loss.item(), grads


def flat(g):
    return torch.cat([g[n].flatten() for n in sorted(g)])


def mask_case(name, path, ids, inputs, unmasked_config, expected, variants):
    """One mask case: the references, then each distattn variant (extra inputs beside `inputs`)."""
    ref_loss, ref = loss_and_grads(path, "sdpa", torch.float32, ids, **inputs)
    sdpa_loss, sdpa = loss_and_grads(path, "sdpa", torch.bfloat16, ids, **inputs)
    plain_loss, plain = loss_and_grads(path, "sdpa", torch.float32, ids, config=unmasked_config)
    whole_sdpa = rel(flat(sdpa), flat(ref))
    bar = {n: 2 * max(rel(sdpa[n], ref[n]), whole_sdpa) for n in ref}
    row = {"case": name, "loss_ref_f32": ref_loss, "loss_sdpa_bf16": sdpa_loss, "grad_rel_err_sdpa": whole_sdpa,
           "loss_ref_without_mask": plain_loss,
           # How far over the bar ignoring the mask would be: must be >= 4 for the case to mean anything.
           "without_mask_over_bar": max(rel(plain[n], ref[n]) / bar[n] for n in ref)}
    ok = row["without_mask_over_bar"] >= 4
    for variant, extra in variants.items():
        start = len(CALLS)
        loss, ours = loss_and_grads(path, distflash.transformers.NAME, torch.bfloat16, ids, **inputs, **extra)
        calls = CALLS[start:]
        r = {"loss_bf16": loss, "grad_rel_err": rel(flat(ours), flat(ref)),
             "worst_param_over_bar": max(rel(ours[n], ref[n]) / bar[n] for n in ref),
             "kernel_calls": len(calls), "masks_as_expected": calls == [expected] * DIMS["num_hidden_layers"]}
        r["passed"] = bool(abs(loss - ref_loss) <= 2 * abs(sdpa_loss - ref_loss) + 1e-3 * abs(ref_loss)
                           and r["grad_rel_err"] <= 2 * whole_sdpa and r["worst_param_over_bar"] <= 1
                           and r["masks_as_expected"])
        if not r["masks_as_expected"]:
            r["masks_seen"] = calls
        row[variant] = r
        ok &= r["passed"]
    row["passed"] = bool(ok)
    return row


def decode_case(path):
    """A cached prefill of 300 tokens (more than the window) and one decoding step."""
    ids = tokens(1, 301, seed=5)
    logits = {}
    for run, impl, dtype in [("ref", "sdpa", torch.float32), ("sdpa", "sdpa", torch.bfloat16),
                             ("distattn", distflash.transformers.NAME, torch.bfloat16)]:
        m = load(path, impl, dtype)
        with torch.no_grad():
            pre = m(input_ids=ids[:, :300], use_cache=True)
            step = m(input_ids=ids[:, 300:], past_key_values=pre.past_key_values, use_cache=True)
        logits[run] = (pre.logits[:, -1].double(), step.logits[:, -1].double())
    row = {"case": "decode"}
    ok = True
    for i, what in enumerate(["prefill_last_logits", "decode_logits"]):
        ours, theirs = rel(logits["distattn"][i], logits["ref"][i]), rel(logits["sdpa"][i], logits["ref"][i])
        row[what] = {"distattn": ours, "sdpa": theirs}
        ok &= ours <= 2 * theirs
    row["passed"] = bool(ok)
    return row


def refusals(llama):
    from transformers.masking_utils import and_masks, causal_mask_function, or_masks, packed_sequence_mask_function

    def refused(fn, words):
        try:
            fn()
            return "no error", False
        except ValueError as e:
            return str(e), words in str(e)

    m = load(llama, distflash.transformers.NAME, torch.bfloat16)
    ids = tokens(2, SEQ)
    padding = torch.ones_like(ids)
    padding[0, :5] = 0
    rows = torch.stack([packed_positions(1)[0], torch.arange(SEQ, device=DEVICE)])
    # Bidirectional blocks (a multimodal model's image tokens, transformers' blockwise overlay):
    # tokens 4-9 see each other.
    blocks = torch.full((1, 16), -1, device=DEVICE)
    blocks[0, 4:10] = 0
    opens = or_masks(causal_mask_function, lambda b, h, q, kv: (blocks[b, q] == blocks[b, kv]) & (blocks[b, q] >= 0))
    docs = torch.tensor([[0] * 7 + [1] * 9], device=DEVICE)
    build = lambda f: distflash.transformers.mask_builder(batch_size=1, q_length=16, kv_length=16, mask_function=f, device=DEVICE)
    out, ok = {}, True
    for name, fn, words in [
        ("padding", lambda: m(input_ids=ids, attention_mask=padding, use_cache=False), "dense attention mask"),
        ("rows_packed_differently", lambda: m(input_ids=ids, position_ids=rows, use_cache=False), "pack different documents"),
        ("mask_opening_later_tokens", lambda: build(opens), "see later ones"),
    ]:
        out[name], passed = refused(fn, words)
        ok &= passed
    out["builder_causal"] = repr(build(causal_mask_function))
    out["builder_packed"] = repr(build(and_masks(causal_mask_function, packed_sequence_mask_function(docs))))
    ok &= out["builder_causal"] == out["builder_packed"] == "None"
    out["passed"] = bool(ok)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import transformers

    distflash.transformers.register()
    record_calls()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "transformers": transformers.__version__}
    llama = saved("Llama")
    mistral = saved("Mistral", sliding_window=WINDOW)
    packed = {"doc_lens": DOCS, "window": None}
    cases = [
        ("packed", lambda: mask_case(
            "packed", llama, tokens(1, SEQ), {"position_ids": packed_positions(1)}, {}, packed,
            {"distattn": {}, "distattn_cu_seq_lens": {
                "cu_seq_lens_q": offsets(1), "cu_seq_lens_k": offsets(1), "max_length_q": max(DOCS), "max_length_k": max(DOCS)}})),
        ("packed_batch2", lambda: mask_case(
            "packed_batch2", llama, tokens(2, SEQ), {"position_ids": packed_positions(2)}, {}, packed, {"distattn": {}})),
        ("window", lambda: mask_case(
            "window", mistral, tokens(2, 1024), {}, {"sliding_window": None}, {"doc_lens": [], "window": WINDOW},
            {"distattn": {}})),
        ("window_packed", lambda: mask_case(
            "window_packed", mistral, tokens(1, SEQ), {"position_ids": packed_positions(1)}, {"sliding_window": None},
            {"doc_lens": DOCS, "window": WINDOW}, {"distattn": {}})),
        ("decode", lambda: decode_case(mistral)),
        ("refusals", lambda: refusals(llama)),
    ]
    ok = True
    for name, fn in cases:
        try:
            report[name] = fn()
        except Exception as e:  # one failing case still writes the others
            report[name] = {"exception": f"{type(e).__name__}: {e}", "passed": False}
        print(json.dumps({name: report[name]}))
        ok &= report[name]["passed"]
        json.dump(report, open(a.out, "w"), indent=1)
    report["passed"] = bool(ok)
    json.dump(report, open(a.out, "w"), indent=1)
    print("PASSED" if ok else "FAILED", {n: report[n]["passed"] for n, _ in cases})
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
