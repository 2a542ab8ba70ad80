"""The self-attention sublayer of nn.TransformerDecoderLayer (attntrace.bridges.decoder) against
the layer's own submodules, run as torch's TransformerDecoderLayer.forward runs them, at 1e-10
in float64; the block spec's `block_part = "self_attention"`; bad input in one line."""

from __future__ import annotations

import numpy as np
import pytest

from mathcheck import in_ci  # noqa: E402

# under CI=true a missing torch fails the file instead of skipping it
torch = __import__("torch") if in_ci() else pytest.importorskip("torch")

import attntrace  # noqa: E402
from attntrace.model.errors import BadInput, Unsupported  # noqa: E402

TOL = 1e-10
MAX_DIFF: dict = {}  # case -> the largest difference measured (printed by the last test, -s)


def random_decoder_layer(d_model=8, nhead=2, d_ff=16, norm_first=False, batch_first=True, seed=0):
    """A TransformerDecoderLayer in eval mode, float64, every parameter drawn N(0, 1) (the
    default init leaves the norm at gain 1, bias 0, which would hide a swapped gain)."""
    torch.manual_seed(seed)
    layer = torch.nn.TransformerDecoderLayer(d_model, nhead, dim_feedforward=d_ff, dropout=0.1, norm_first=norm_first,
                                             batch_first=batch_first).double().eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_()
    return layer


def torch_self_attention_sublayer(layer, tgt, tgt_mask, tgt_key_padding_mask, tgt_is_causal):
    """The first sublayer exactly as TransformerDecoderLayer.forward computes it (torch 2.x):
    norm_first: x + _sa_block(norm1(x), ...); else norm1(x + _sa_block(x, ...))."""
    x = tgt
    with torch.no_grad():
        if layer.norm_first:
            return x + layer._sa_block(layer.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
        return layer.norm1(x + layer._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))


def _masks(kind, T):
    """(tgt_mask for attntrace, tgt_mask for torch, tgt_is_causal)."""
    if kind == "float_causal":
        m = torch.nn.Transformer.generate_square_subsequent_mask(T, dtype=torch.float64)
        return m, m, True
    if kind == "bool_causal":
        m = torch.ones(T, T, dtype=torch.bool).triu(1)
        return m, m, False
    # tgt_is_causal alone: torch's MHA needs the mask with the hint, which nn.TransformerDecoder builds
    return None, torch.nn.Transformer.generate_square_subsequent_mask(T, dtype=torch.float64), True


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("nhead", [1, 2])
@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("mask", ["float_causal", "bool_causal", "is_causal_only"])
def test_decoder_self_attention_equals_torch(norm_first, nhead, padding, mask):
    T, d = 5, 8
    layer = random_decoder_layer(d, nhead, 16, norm_first, seed=nhead + 2 * norm_first)
    tgt = torch.tensor(np.random.default_rng(nhead).standard_normal((1, T, d)))
    ours_mask, torch_mask, causal = _masks(mask, T)
    pad = torch.tensor([[False, False, False, True, True]]) if padding else None
    if pad is not None and torch_mask.dtype != torch.bool:
        pad = torch.zeros(1, T, dtype=torch.float64).masked_fill(pad, float("-inf"))  # the same type as the mask
    t = attntrace.from_torch_decoder_self_attention(layer, tgt, tgt_mask=ours_mask, tgt_is_causal=causal,
                                                    tgt_key_padding_mask=pad)
    ids = [s.id for s in t.steps]
    assert ids[-1] == ("residual1" if norm_first else "norm1")
    assert (ids[0] == "norm1") == norm_first and "norm2" not in ids and not any(i.startswith("ffn") for i in ids)
    want = torch_self_attention_sublayer(layer, tgt, torch_mask, pad, causal)[0].numpy()
    diff = float(np.abs(t.steps[-1].value - want).max())
    MAX_DIFF[(norm_first, nhead, padding, mask)] = diff
    assert diff <= TOL
    # the self-attention itself: the output projection equals the layer's self_attn
    attn_in = layer.norm1(tgt) if norm_first else tgt
    with torch.no_grad():
        o = layer.self_attn(attn_in, attn_in, attn_in, attn_mask=torch_mask, key_padding_mask=pad, need_weights=False)[0][0]
    np.testing.assert_allclose(t.step("output").value, o.numpy(), rtol=0, atol=TOL)
    # the causal mask really is applied: no weight above the diagonal, padded keys get none
    w = t.step("weights", 1 if nhead > 1 else None).value
    assert np.all(np.triu(w, 1) == 0)
    if padding:
        assert np.all(w[:, 3:] == 0)


def test_sequence_first_layout_and_the_whole_layers_first_sublayer():
    """batch_first=False takes (T, 1, E); the sublayer's output is what the cross-attention reads:
    with a zero cross-attention and a zero FFN, a post-LN layer's output is norm3(norm2(sublayer))."""
    layer = random_decoder_layer(6, 2, 10, False, batch_first=False, seed=7)
    T = 4
    tgt = torch.tensor(np.random.default_rng(7).standard_normal((T, 1, 6)))
    mask = torch.nn.Transformer.generate_square_subsequent_mask(T, dtype=torch.float64)
    t = attntrace.from_torch_decoder_self_attention(layer, tgt, tgt_mask=mask, tgt_is_causal=True)
    want = torch_self_attention_sublayer(layer, tgt, mask, None, True)[:, 0].numpy()
    np.testing.assert_allclose(t.steps[-1].value, want, rtol=0, atol=TOL)
    with torch.no_grad():
        for lin in (layer.multihead_attn.out_proj, layer.linear2):
            lin.weight.zero_()
            lin.bias.zero_()
        memory = torch.randn(3, 1, 6, dtype=torch.float64)
        full = layer(tgt, memory, tgt_mask=mask, tgt_is_causal=True)[:, 0]
        expect = layer.norm3(layer.norm2(torch.tensor(t.steps[-1].value)))
    np.testing.assert_allclose(full.numpy(), expect.numpy(), rtol=0, atol=TOL)


def test_spec_is_a_block_spec_with_block_part():
    from attntrace.bridges.decoder import decoder_self_attention_spec

    layer = random_decoder_layer(4, 1, 6, True, seed=1)
    spec = decoder_self_attention_spec(layer, np.zeros((3, 4)), tgt_is_causal=True)
    assert spec["block"] == "pre_ln" and spec["block_part"] == "self_attention" and spec["mask"] == "causal"
    assert "ffn" not in spec and "norm2" not in spec and set(spec["norm1"]) == {"gain", "bias", "eps"}


@pytest.mark.parametrize("block", ["post_ln", "pre_ln", "llama"])
def test_block_part_in_a_plain_spec(block):
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((3, 4)), [rng.standard_normal((4, 4)) for _ in range(4)]
    spec = {"X": x, "W_Q": w[0], "W_K": w[1], "W_V": w[2], "W_O": w[3], "block": block, "block_part": "self_attention",
            "norm1": {"gain": rng.standard_normal(4), "eps": 1e-5}}
    t = attntrace.run(spec)
    post_ids = [s.id for s in t.steps if s.id in ("norm1", "residual1")]
    assert post_ids == (["residual1", "norm1"] if block == "post_ln" else ["norm1", "residual1"])
    for fmt in ("md", "tex", "text"):
        for lang in ("en", "zh"):
            assert attntrace.render(t, format=fmt, lang=lang)
    for mode in ("symbolic", "shape"):
        assert attntrace.render(attntrace.run(spec, mode=mode))


BASE = {"X": [[1, 0], [0, 1]], "W_Q": [[1, 0], [0, 1]], "W_K": [[1, 0], [0, 1]], "W_V": [[1, 0], [0, 1]], "block": "post_ln"}


@pytest.mark.parametrize("extra, message", [
    ({"block_part": "ffn"}, "block_part must be \"self_attention\""),
    ({"block_part": "self_attention", "ffn": {"W_1": [[1], [0]], "W_2": [[1, 0]]}}, "drop ffn"),
    ({"block_part": "self_attention", "norm2": {"eps": 1e-5}}, "drop norm2"),
    ({"block": None, "block_part": "self_attention"}, "block_part belongs to a Transformer block"),
])
def test_bad_block_part_is_one_line(extra, message):
    spec = {k: v for k, v in {**BASE, **extra}.items() if v is not None}
    with pytest.raises(BadInput) as exc:
        attntrace.run(spec)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_bad_inputs_are_one_line():
    layer = random_decoder_layer(4, 2, 6, False, seed=2)
    enc = torch.nn.TransformerEncoderLayer(4, 2, 6).double().eval()
    cases = [
        ((enc, np.zeros((3, 4))), {}, "traces torch.nn.TransformerDecoderLayer, not TransformerEncoderLayer"),
        ((torch.nn.Linear(4, 4), np.zeros((3, 4))), {}, "not Linear"),
        ((layer, np.zeros((3, 5))), {}, "tgt must be (T, 4) or a batch of one (1, T, 4), not of shape (3, 5)"),
        ((layer, np.zeros((2, 3, 4))), {}, "not of shape (2, 3, 4)"),
        ((layer, np.zeros(4)), {}, "not of shape (4,)"),
        ((layer, np.zeros((3, 4))), {"tgt_mask": torch.zeros(4, 4)}, "tgt_mask has shape (4, 4); expected (3, 3)"),
        ((layer, np.zeros((3, 4))), {"tgt_key_padding_mask": torch.zeros(1, 5, dtype=torch.bool)}, "key_padding_mask has shape"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(BadInput) as exc:
            attntrace.from_torch_decoder_self_attention(*args, **kwargs)
        assert message in str(exc.value) and "\n" not in str(exc.value), (message, str(exc.value))
    layer.train()
    with pytest.raises(Unsupported, match="eval"):
        attntrace.from_torch_decoder_self_attention(layer, np.zeros((3, 4)))


def test_zz_report_max_differences():
    """Prints the largest differences measured above (pytest -s); all within 1e-10."""
    if MAX_DIFF:
        print("\nmax |trace - torch| per case:", max(MAX_DIFF.values()))
        for case, diff in sorted(MAX_DIFF.items(), key=str):
            print(" ", case, f"{diff:.2e}")
        assert max(MAX_DIFF.values()) <= TOL


def test_the_report_says_it_traces_the_sublayer_only():
    """The intro and title name the self-attention sublayer, not a whole block with its FFN."""
    torch.manual_seed(3)
    layer = torch.nn.TransformerDecoderLayer(d_model=4, nhead=2, dim_feedforward=8, dropout=0.0).double().eval()
    t = attntrace.from_torch_decoder_self_attention(layer, torch.randn(3, 4, dtype=torch.float64), tgt_is_causal=True)
    en, zh = (" ".join(attntrace.render(t, format="text", lang=lang).split()) for lang in ("en", "zh"))
    assert en.startswith("The self-attention sublayer of a Transformer block (post-LN)")
    assert "feed-forward sublayers are not traced" in en and "feed-forward network. Its data flow" not in en
    assert "自注意力子层" in zh.split("=")[0] and "前馈网络子层不在本推导中" in zh
