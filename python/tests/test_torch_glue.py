"""The autograd glue of ``flash_attn`` on the CPU, where torch is installed (CI has no torch:
skipped there; the GPU run is bench/peers/torch_binding.sh).

The extension is replaced by a stand-in that reads and writes the very addresses it is handed
(``data_ptr()`` of CPU tensors here) and computes attention in float64 with torch, so what is
checked is the Python side: which tensor goes to which argument, the strides and the shape it
announces, LSE, the gradients coming back in the right order, dtype and layout, and the masks
transformers' models hand the integration reaching the kernels as transformers means them.
"""

import contextlib
import ctypes
import math

import pytest

torch = pytest.importorskip("torch")

import distflash.attention as attention  # noqa: E402
from distflash import _checks  # noqa: E402


def view(addr, shape, dtype, strides=None):
    """The memory at `addr` as a `[b, heads, s, d]` tensor (no copy), under the extension's
    (batch, head, seq) element strides (contiguous if None)."""
    b, n, s, d = shape if len(shape) == 4 else (*shape, 1)
    if strides is None:
        strides = [n * s * d, s * d, d]
    sb, sh, ss = strides
    extent = (b - 1) * sb + (n - 1) * sh + (s - 1) * ss + d
    width = torch.empty((), dtype=dtype).element_size()
    buf = (ctypes.c_byte * (extent * width)).from_address(addr)
    flat = torch.frombuffer(buf, dtype=dtype)
    if len(shape) == 3:
        return flat.view(shape)
    return flat.as_strided(shape, (sb, sh, ss, 1))


def visible(n, doc_lens=(), window=None, global_tokens=0):
    """The [n, n] boolean matrix of which keys each query sees, from the mask's definition
    (distflash's `shape::Mask`): k <= q and ((same document and q - window < k) or k < global_tokens)."""
    doc = torch.repeat_interleave(torch.arange(len(doc_lens or [n])), torch.tensor(list(doc_lens or [n])))
    q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
    local = (doc[:, None] == doc[None, :]) & (q - k < (window or n))
    return (k <= q) & (local | (k < global_tokens))


def reference(q, k, v, doc_lens=(), window=None, global_tokens=0):
    """Attention of head-major float64 tensors under the mask: O and LSE."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~visible(q.shape[2], doc_lens, window, global_tokens), float("-inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


class FakeExtension:
    """`_distflash` on CPU memory: the same arguments, float64 math."""

    def __init__(self):
        self.calls = []
        self.addresses = []
        self.masks = []  # (doc_lens, window, global_tokens) of every forward

    def forward(self, device, dtype, stream, b, s, h, hk, d, q, k, v, out, lse, qs, kvs, *mask):
        self.calls.append(("forward", dtype, (b, s, h, hk, d)))
        self.addresses.append((q, k, v))
        self.masks.append(mask)
        dt = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
        sides = ((q, h, qs), (k, hk, kvs), (v, hk, kvs))
        o, l = reference(*(view(p, (b, n, s, d), dt, st).double() for p, n, st in sides), *mask)
        view(out, (b, h, s, d), dt, qs).copy_(o)
        view(lse, (b, h, s), torch.float32).copy_(l)

    def kv_grads_in_input_dtype(self, b, s, h, hk, d):
        return h == hk

    def backward(self, device, dtype, stream, b, s, h, hk, d, q, k, v, out, lse, dout, dq, dk, dv, qs, kvs, *mask):
        self.calls.append(("backward", dtype, (b, s, h, hk, d)))
        dt = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
        sides = ((q, h, qs), (k, hk, kvs), (v, hk, kvs))
        x = [view(p, (b, n, s, d), dt, st).double().requires_grad_() for p, n, st in sides]
        with torch.enable_grad():  # autograd runs a backward with grad mode off
            o, _ = reference(*x, *mask)
            grads = torch.autograd.grad(o, x, view(dout, (b, h, s, d), dt, qs).double())
        kv_dt = dt if self.kv_grads_in_input_dtype(b, s, h, hk, d) else torch.float32
        for addr, n, st, g, gdt in zip((dq, dk, dv), (h, hk, hk), (qs, kvs, kvs), grads, (torch.float32, kv_dt, kv_dt)):
            view(addr, (b, n, s, d), gdt, st).copy_(g)


@pytest.fixture
def fake(monkeypatch):
    """The stand-in extension, CPU tensors let through the device check, no CUDA calls."""
    ext = FakeExtension()
    monkeypatch.setattr(attention, "_FUNCTION", None)
    import distflash

    monkeypatch.setattr(distflash, "_distflash", ext, raising=False)
    monkeypatch.setitem(__import__("sys").modules, "distflash._distflash", ext)
    monkeypatch.setattr(attention, "_stream", lambda torch, device: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    real = _checks._check_one

    def on_cpu(t, name):
        real(_Cuda(t), name)

    monkeypatch.setattr(_checks, "_check_one", on_cpu)
    return ext


class _Cuda:
    """A CPU tensor as the device check sees a CUDA one."""

    def __init__(self, t):
        self._t = t
        self.device = type("D", (), {"type": "cuda", "index": 0})()

    def __getattr__(self, name):
        return getattr(self._t, name)


@pytest.mark.parametrize("b,s,h,hk,d,dt", [(2, 37, 4, 2, 64, torch.bfloat16), (1, 20, 4, 1, 128, torch.float16)])
def test_flash_attn_glue_matches_float64_attention(fake, b, s, h, hk, d, dt):
    g = torch.Generator().manual_seed(s)
    q, k, v, dout = (torch.randn(b, s, n, d, generator=g).to(dt) for n in (h, hk, hk, h))
    x = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = attention.flash_attn(*x, return_lse=True)
    assert out.shape == (b, s, h, d) and out.dtype == dt and out.is_contiguous()
    assert lse.shape == (b, h, s) and lse.dtype == torch.float32 and not lse.requires_grad
    grads = torch.autograd.grad(out, x, dout)
    assert fake.calls == [("forward", str(dt)[6:], (b, s, h, hk, d)), ("backward", str(dt)[6:], (b, s, h, hk, d))]

    r = [t.double().transpose(1, 2).requires_grad_() for t in (q, k, v)]
    ro, rl = reference(*r)
    rg = torch.autograd.grad(ro, r, dout.double().transpose(1, 2))
    # One rounding to the 16-bit dtype of values O(1): within 2^-7 (bf16) of float64.
    tol = 2.0 ** -7
    assert (out.double() - ro.transpose(1, 2)).abs().max() <= tol * ro.abs().max()
    assert (lse.double() - rl).abs().max() <= 1e-5 * rl.abs().max()
    for got, want in zip(grads, rg):
        assert got.dtype == dt and got.shape == want.transpose(1, 2).shape
        assert (got.double() - want.transpose(1, 2)).abs().max() <= tol * want.abs().max()


def tiny(transformers, kind, path, **extra):
    """A tiny random-init model of ``kind`` ("Llama", "Mistral") saved to ``path``."""
    cfg = getattr(transformers, f"{kind}Config")(
        vocab_size=128, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, max_position_embeddings=256, **extra)
    torch.manual_seed(0)
    getattr(transformers, f"{kind}ForCausalLM")(cfg).save_pretrained(path)


def loss_and_grad(transformers, path, impl, dtype, ids, config=None, **inputs):
    cfg = transformers.AutoConfig.from_pretrained(path)
    for k, v in (config or {}).items():
        setattr(cfg, k, v)
    m = transformers.AutoModelForCausalLM.from_pretrained(path, config=cfg, attn_implementation=impl, dtype=dtype)
    loss = m(input_ids=ids, labels=ids, use_cache=False, **inputs).loss
    loss.backward()
    return m, loss.item(), torch.cat([p.grad.double().flatten() for p in m.parameters()])


def check_parity(fake, transformers, path, ids, inputs=None, unmasked=None, extra=None):
    """distattn (the stand-in kernels) in bf16 against SDPA in float32: loss and gradients as
    close as SDPA's own bf16 run (x2); with ``unmasked`` (config changes that drop the mask) the
    float32 run without ``inputs`` must be far off (so the mask is really tested). Returns the
    distattn model and the masks the kernels were given."""
    import distflash.transformers as dt

    inputs, extra = inputs or {}, extra or {}
    runs = {r: loss_and_grad(transformers, path, impl, dtype, ids, **inputs, **(extra if r == "ours" else {}))
            for r, impl, dtype in [("ref", "sdpa", torch.float32), ("sdpa", "sdpa", torch.bfloat16),
                                   ("ours", dt.register(), torch.bfloat16)]}
    _, ref_loss, ref_grad = runs["ref"]
    err = {r: (abs(runs[r][1] - ref_loss), ((runs[r][2] - ref_grad).norm() / ref_grad.norm()).item()) for r in ("sdpa", "ours")}
    assert err["ours"][0] <= 2 * err["sdpa"][0] + 1e-3 * ref_loss, err
    assert err["ours"][1] <= 2 * err["sdpa"][1], err
    if unmasked is not None:
        _, _, plain = loss_and_grad(transformers, path, "sdpa", torch.float32, ids, config=unmasked)
        assert ((plain - ref_grad).norm() / ref_grad.norm()).item() > 10 * err["sdpa"][1], err
    assert [c[0] for c in fake.calls] == ["forward", "forward", "backward", "backward"]
    return runs["ours"][0], fake.masks


def test_transformers_llama_runs_through_the_glue(fake, tmp_path):
    """A tiny LLaMA loaded with ``attn_implementation="distattn"``: every layer's attention goes
    through the (stand-in) kernels, loss and gradients agree with SDPA's in float32 as closely
    as SDPA's own bf16 run does (x2), and a padding mask is refused."""
    transformers = pytest.importorskip("transformers")
    tiny(transformers, "Llama", tmp_path)
    ids = torch.randint(0, 128, (2, 48), generator=torch.Generator().manual_seed(1))
    m, masks = check_parity(fake, transformers, tmp_path, ids)
    assert masks == [([], None, 0)] * 2
    mask = torch.ones_like(ids)
    mask[0, 0] = 0
    with pytest.raises(ValueError, match="got a dense attention mask"):
        m(input_ids=ids, attention_mask=mask)


DOCS = [20, 13, 15]


def packed(batch=1):
    return torch.cat([torch.arange(n) for n in DOCS]).expand(batch, -1)


@pytest.mark.parametrize("batch,offsets", [(1, False), (1, True), (2, False)])
def test_transformers_packed_documents_reach_the_kernels(fake, tmp_path, batch, offsets):
    """Documents packed into a row, marked by position ids restarting at 0 (and by the
    collator's cu_seq_lens beside them), as transformers' SDPA masks them."""
    transformers = pytest.importorskip("transformers")
    tiny(transformers, "Llama", tmp_path)
    ids = torch.randint(0, 128, (batch, sum(DOCS)), generator=torch.Generator().manual_seed(2))
    cu = torch.tensor([0, 20, 33, 48], dtype=torch.int32)
    extra = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": 20, "max_length_k": 20} if offsets else {}
    _, masks = check_parity(fake, transformers, tmp_path, ids, {"position_ids": packed(batch)}, {}, extra)
    assert masks == [(DOCS, None, 0)] * 2


@pytest.mark.parametrize("docs", [False, True])
def test_transformers_mistral_sliding_window_reaches_the_kernels(fake, tmp_path, docs):
    """Mistral's sliding_window W < seq (and over packed documents): the kernels get window=W,
    and agree with transformers' SDPA mask."""
    transformers = pytest.importorskip("transformers")
    tiny(transformers, "Mistral", tmp_path, sliding_window=8)
    ids = torch.randint(0, 128, (1 if docs else 2, sum(DOCS)), generator=torch.Generator().manual_seed(3))
    inputs = {"position_ids": packed()} if docs else {}
    _, masks = check_parity(fake, transformers, tmp_path, ids, inputs, {"sliding_window": None})
    assert masks == [(DOCS if docs else [], 8, 0)] * 2


def test_transformers_decoding_with_a_cache_goes_to_sdpa(fake, tmp_path):
    """A cached prefill longer than Mistral's window runs on the (stand-in) kernels; the next
    token's step (one query, a cache of keys) runs in transformers' SDPA under the mask the
    builder hands on; both within 2x SDPA-bf16's error of float32 SDPA."""
    transformers = pytest.importorskip("transformers")
    import distflash.transformers as dt

    tiny(transformers, "Mistral", tmp_path, sliding_window=8)
    ids = torch.randint(0, 128, (1, 21), generator=torch.Generator().manual_seed(4))
    logits = {}
    for run, impl, dtype in [("ref", "sdpa", torch.float32), ("sdpa", "sdpa", torch.bfloat16), ("ours", dt.register(), torch.bfloat16)]:
        m = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation=impl, dtype=dtype)
        with torch.no_grad():
            pre = m(input_ids=ids[:, :20], use_cache=True)
            step = m(input_ids=ids[:, 20:], past_key_values=pre.past_key_values, use_cache=True)
        logits[run] = (pre.logits[:, -1].double(), step.logits[:, -1].double())
    assert fake.masks == [([], 8, 0)] * 2  # the prefill only
    for i in range(2):
        err = {r: ((logits[r][i] - logits["ref"][i]).norm() / logits["ref"][i].norm()).item() for r in ("sdpa", "ours")}
        assert err["ours"] <= 2 * err["sdpa"], (i, err)


def test_real_cpu_tensors_are_refused_in_a_sentence(monkeypatch):
    # As on a GPU machine (test_checks.py has the sentence of a machine without one).
    monkeypatch.setattr(_checks, "gpu_present", lambda: True)
    q = torch.zeros(1, 8, 4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"^q is on cpu; .*\.cuda\(\)$"):
        attention.flash_attn(q, q, q)
    with pytest.raises(TypeError, match=r"^q is torch.float32; "):
        _checks._check_one(_Cuda(q.float()), "q")


def test_views_go_in_without_a_copy_and_others_are_copied_once(fake):
    """A slice of a fused QKV projection and transposed views are read in place (their own
    addresses reach the kernels) and give the contiguous tensors' results; a view whose head
    dim is not contiguous is copied."""
    b, s, h, d = 2, 24, 4, 64
    g = torch.Generator().manual_seed(3)
    fused = torch.randn(b, s, 3 * h, d, generator=g).to(torch.bfloat16)
    q, k, v = fused[:, :, :h], fused[:, :, h:2 * h], fused[:, :, 2 * h:]
    dout = torch.randn(b, s, h, d, generator=g).to(torch.bfloat16)
    x = [t.requires_grad_() for t in (q.clone(), k.clone(), v.clone())]
    want = attention.flash_attn(*x)
    want_grads = torch.autograd.grad(want, x, dout)
    fused.requires_grad_()
    views = (fused[:, :, :h], fused[:, :, h:2 * h], fused[:, :, 2 * h:])
    got = attention.flash_attn(*views)
    assert fake.addresses[-1] == tuple(t.data_ptr() for t in views)
    assert torch.equal(got, want)
    (grad,) = torch.autograd.grad(got, fused, dout)
    assert torch.equal(grad, torch.cat(want_grads, dim=2))
    # transformers' [b, h, s, d] views of [b, s, h, d] memory: no copy, the same result.
    out, _ = attention.attend_head_major(*(t.transpose(1, 2) for t in views))
    assert fake.addresses[-1] == tuple(t.data_ptr() for t in views)
    assert torch.equal(out.transpose(1, 2), want)
    # The head dim strided: copied (another address), the same result.
    odd = torch.randn(b, s, h, 2 * d, generator=g).to(torch.bfloat16)[..., ::2]
    attention.flash_attn(odd, odd, odd)
    assert fake.addresses[-1][0] != odd.data_ptr()


def test_the_mask_builder_refuses_mask_functions_that_open_later_tokens():
    """transformers' (batch, head, q, kv) predicates, written here: causal, causal within
    documents, and causal with a bidirectional block (a multimodal model's image tokens)."""
    import distflash.transformers as dt

    causal = lambda b, h, q, kv: kv <= q
    docs = torch.tensor([[0] * 7 + [1] * 9])
    packed = lambda b, h, q, kv: causal(b, h, q, kv) & (docs[b, q] == docs[b, kv])
    blocks = torch.full((1, 16), -1)
    blocks[0, 4:10] = 0
    opened = lambda b, h, q, kv: causal(b, h, q, kv) | ((blocks[b, q] == blocks[b, kv]) & (blocks[b, q] >= 0))
    build = lambda f: dt.mask_builder(batch_size=1, q_length=16, kv_length=16, mask_function=f)
    assert build(causal) is None and build(packed) is None
    with pytest.raises(ValueError, match=r"^this model's mask lets tokens see later ones"):
        build(opened)
