"""The engineer's API (issue 23, section 1), against the real modules: torch's nn layers and
tiny random Hugging Face models built offline in float64 (tests/oracles.py, oracles_block.py).

- `attntrace.from_torch(module, x, ...)` dispatches on the module's type; `trace.output`
  equals the module's own output for each type (1e-10 in float64);
- a module it cannot trace gets one line naming what it can;
- `trace.output` is the forward result, never a gradient, with backward on;
- the online softmax's blocks each have an address (`block=`), in the JSON too;
- head indexing: head=1 on one head; query_head= / kv_head= under grouped-query attention;
- the bridges pass what the modules take: src_key_padding_mask, HF attention_mask (BERT,
  GPT-2 with padding), position_ids, rope_float64.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from mathcheck import in_ci  # noqa: E402

torch = __import__("torch") if in_ci() else pytest.importorskip("torch")

import attntrace  # noqa: E402
import oracles  # noqa: E402
import oracles_block as ob  # noqa: E402
from attntrace.model.errors import BadInput, Unsupported  # noqa: E402

TOL = 1e-10


def _x(n, d, seed=0):
    return torch.tensor(np.random.default_rng(seed).standard_normal((1, n, d)))


# -- from_torch dispatch: each module type, trace.output == the module's output ---------------------
def test_multihead_attention():
    torch.manual_seed(0)
    m = torch.nn.MultiheadAttention(8, 2, batch_first=True, dtype=torch.float64).eval()
    x = _x(4, 8)
    mask = torch.ones(4, 4, dtype=torch.bool).triu(1)
    t = attntrace.from_torch(m, x, attn_mask=mask)
    with torch.no_grad():
        want = m(x, x, x, attn_mask=mask)[0][0].numpy()
    np.testing.assert_allclose(t.output, want, rtol=0, atol=TOL)
    assert t.output_step.id == "output"


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer(norm_first):
    layer = ob.random_encoder_layer(8, 2, 16, norm_first=norm_first, seed=3)
    x = _x(5, 8, 1)
    t = attntrace.from_torch(layer, x)
    with torch.no_grad():
        want = layer(x)[0].numpy()
    np.testing.assert_allclose(t.output, want, rtol=0, atol=TOL)
    assert np.abs(want).max() > 0.5


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_self_attention_sublayer(norm_first):
    from test_block_decoder import random_decoder_layer, torch_self_attention_sublayer

    layer = random_decoder_layer(8, 2, 16, norm_first, seed=5)
    tgt = _x(5, 8, 2)
    t = attntrace.from_torch(layer, tgt, tgt_is_causal=True)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(5, dtype=torch.float64)
    want = torch_self_attention_sublayer(layer, tgt, mask, None, True)[0].numpy()
    np.testing.assert_allclose(t.output, want, rtol=0, atol=TOL)


def _llama(seed=1, d=16, h=4, h_kv=2, n=5):
    ref = oracles.llama_attention_layer(seed, hidden_size=d, num_heads=h, num_kv_heads=h_kv, n=n)
    from test_hf_bridge import _model

    return _model(seed, d, h, h_kv), ref


def test_hf_attention_module():
    model, ref = _llama()
    t = attntrace.from_torch(model.layers[0].self_attn, ref["x"])
    np.testing.assert_allclose(t.output, ref["output"], rtol=0, atol=TOL)


def test_hf_decoder_layer_and_model_with_layer():
    model, x, y = ob.hf_llama_decoder_layer(seed=7)
    np.testing.assert_allclose(attntrace.from_torch(model.layers[0], x).output, y, rtol=0, atol=TOL)
    np.testing.assert_allclose(attntrace.from_torch(model, x, layer=0).output, y, rtol=0, atol=TOL)


@pytest.mark.parametrize("which", ["bert", "gpt2"])
def test_hf_bert_and_gpt2(which):
    model = (ob.tiny_bert if which == "bert" else ob.tiny_gpt2)(seed=4)
    module = model.encoder.layer[1] if which == "bert" else model.h[1]
    x, y = ob.hf_layer_io(module, lambda: model(input_ids=torch.tensor([[1, 5, 7, 3, 2]])))
    np.testing.assert_allclose(attntrace.from_torch(model, x, layer=1).output, y, rtol=0, atol=TOL)
    np.testing.assert_allclose(attntrace.from_torch(module, x).output, y, rtol=0, atol=TOL)


def test_a_model_without_layer_asks_for_it():
    model = ob.tiny_bert(seed=0)
    with pytest.raises(BadInput, match=r"^BertModel is a whole model: give layer=i") as info:
        attntrace.from_torch(model, np.zeros((3, 8)))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("module", [lambda: torch.nn.Linear(4, 4), lambda: torch.nn.LayerNorm(4),
                                    lambda: ob.tiny_gpt2(seed=0).h[0].attn, lambda: "not a module"])
def test_what_it_cannot_trace_is_one_line_naming_what_it_can(module):
    with pytest.raises(Unsupported) as info:
        attntrace.from_torch(module(), np.zeros((3, 4)))
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("from_torch cannot trace ")
    for name in ("nn.MultiheadAttention", "nn.TransformerEncoderLayer", "nn.TransformerDecoderLayer",
                 "Hugging Face model with layer=i", "Llama-style attention module", "BertLayer", "GPT2Block"):
        assert name in msg


def test_the_long_forms_are_the_same_traces():
    layer = ob.random_encoder_layer(8, 2, 16, seed=1)
    x = _x(3, 8)
    assert attntrace.from_torch(layer, x).to_dict() == attntrace.from_torch_layer(layer, x).to_dict()


# -- trace.output: the forward result, never a gradient --------------------------------------------
def test_output_is_the_forward_result_with_backward_on():
    torch.manual_seed(2)
    m = torch.nn.MultiheadAttention(4, 2, batch_first=True, dtype=torch.float64).eval()
    x = _x(3, 4)
    t = attntrace.from_torch(m, x, backward={"dO": np.ones((3, 4)).tolist()})
    assert t.steps[-1].id.startswith("d")  # the last step is a gradient ...
    with torch.no_grad():
        want = m(x, x, x)[0][0].numpy()
    np.testing.assert_allclose(t.output, want, rtol=0, atol=TOL)  # ... the output is not
    assert t.to_dict()["output"] == "output"


def test_output_of_a_single_head_without_w_o_is_z():
    t = attntrace.run({"Q": [[1, 0], [0, 1]], "K": [[1, 0], [0, 1]], "V": [[1, 2], [3, 4]]})
    assert t.output_step.id == "Z" and t.output is t.step("Z").value


# -- online blocks ------------------------------------------------------------------------------
def _online(block_queries=None):
    rng = np.random.default_rng(4)
    online = {"block_keys": 2, **({"block_queries": block_queries} if block_queries else {})}
    return attntrace.run({"Q": rng.standard_normal((4, 2)).round(2).tolist(), "K": rng.standard_normal((5, 2)).round(2).tolist(),
                          "V": rng.standard_normal((5, 2)).round(2).tolist(), "online": online})


def test_each_online_block_has_its_own_address():
    t = _online()
    scores = t.step("scaled").value
    for j, (c0, c1) in enumerate(((0, 2), (0, 4), (0, 5)), start=1):  # the running max over the keys seen so far
        np.testing.assert_array_equal(t.step("online_max", block=j).value[:, 0], scores[:, c0:c1].max(axis=1))
    assert t.step("online_max") is t.step("online_max", block=3)  # no block: the last, as an answer gives it
    with pytest.raises(KeyError, match="block 4"):
        t.step("online_max", block=4)
    blocks = [s["block"] for s in t.to_dict()["steps"] if s["id"] == "online_sum"]
    assert blocks == [1, 2, 3]


def test_online_query_blocks():
    t = _online(block_queries=2)
    scores = t.step("scaled").value
    np.testing.assert_array_equal(t.step("online_max", query_block=2, block=1).value[:, 0], scores[2:, :2].max(axis=1))
    np.testing.assert_array_equal(t.step("online_max", query_block=2).value[:, 0], scores[2:].max(axis=1))


# -- head indexing ------------------------------------------------------------------------------
def test_single_head_accepts_head_1():
    t = attntrace.run({"scores": [[0.8, 0.2], [0.3, 0.7]], "scale": False})
    assert t.step("weights", 1) is t.step("weights") is t.step("weights", query_head=1)


def test_gqa_both_spellings():
    model, ref = _llama(h=4, h_kv=2)
    t = attntrace.from_hf_llama_attention(model, ref["x"])
    # K_rope belongs to a key/value head, Q_rope to a query head
    assert t.step("K_rope", query_head=3) is t.step("K_rope", 2) is t.step("K_rope", kv_head=2)
    np.testing.assert_allclose(t.step("K_rope", query_head=4).value, ref["k_rope"][1], rtol=0, atol=TOL)
    np.testing.assert_allclose(t.step("Q_rope", query_head=3).value, ref["q_rope"][2], rtol=0, atol=TOL)
    assert t.step("Q_rope", 3) is t.step("Q_rope", query_head=3)
    with pytest.raises(KeyError, match="read by query heads 3, 4"):
        t.step("Q_rope", kv_head=2)  # two query heads read key/value head 2: ambiguous
    with pytest.raises(KeyError, match="reads key/value head 2, not 1"):
        t.step("K", query_head=3, kv_head=1)


def test_mqa_kv_head_names_the_one_reader_when_unique():
    model, ref = _llama(seed=2, h=2, h_kv=2, d=12, n=3)  # one query head per key/value head
    t = attntrace.from_hf_llama_attention(model, ref["x"])
    assert t.step("Q_rope", kv_head=2) is t.step("Q_rope", 2)


# -- bridges: what the modules take ------------------------------------------------------------------
def test_encoder_layer_src_key_padding_mask():
    layer = ob.random_encoder_layer(8, 2, 16, seed=6)
    x = _x(5, 8, 3)
    pad = torch.tensor([[False, False, False, True, True]])
    t = attntrace.from_torch(layer, x, src_key_padding_mask=pad)
    with torch.enable_grad():  # the Python path (the fused no_grad path may zero padded rows)
        want = layer(x, src_key_padding_mask=pad)[0].detach().numpy()
    np.testing.assert_allclose(t.output, want, rtol=0, atol=TOL)
    assert np.all(t.step("weights", 1).value[:, 3:] == 0)


@pytest.mark.parametrize("which, am", [("bert", [1, 1, 1, 0, 0]), ("gpt2", [1, 1, 1, 1, 0])])
def test_hf_layer_attention_mask(which, am):
    """BERT with padding and GPT-2 with right padding: the layer's output for every row (padded
    ones included: the model computes them too) at 1e-10."""
    model = (ob.tiny_bert if which == "bert" else ob.tiny_gpt2)(seed=4)
    module = model.encoder.layer[0] if which == "bert" else model.h[0]
    mask = torch.tensor([am])
    x, y = ob.hf_layer_io(module, lambda: model(input_ids=torch.tensor([[1, 5, 7, 3, 2]]), attention_mask=mask))
    t = attntrace.from_torch(model, x, layer=0, attention_mask=am)
    np.testing.assert_allclose(t.output, y, rtol=0, atol=TOL)
    unmasked = attntrace.from_torch(model, x, layer=0)
    assert np.abs(unmasked.output - y).max() > 1e-3  # the mask matters


def test_gpt2_left_padding_is_one_line():
    model = ob.tiny_gpt2(seed=4)
    with pytest.raises(BadInput) as info:
        attntrace.from_torch(model, np.zeros((3, 8)), layer=0, attention_mask=[0, 1, 1])
    assert "\n" not in str(info.value)


def test_bert_and_gpt2_take_no_position_ids():
    with pytest.raises(BadInput, match="takes no position_ids"):
        attntrace.from_torch(ob.tiny_bert(seed=0), np.zeros((3, 8)), layer=0, position_ids=[0, 1, 2])


def test_llama_layer_position_ids_and_mask():
    """from_hf_layer on a Llama-style model passes position_ids (RoPE) and attention_mask: the
    layer's output with positions 3..7 and a padded key, captured from the model's forward."""
    model, _, _ = ob.hf_llama_decoder_layer(seed=7)
    layer = model.layers[0]
    pos = torch.arange(3, 8)[None]
    am = torch.tensor([[1, 0, 1, 1, 1]])
    x, y = ob.hf_layer_io(layer, lambda: model(inputs_embeds=_x(5, 8, 9), position_ids=pos, attention_mask=am))
    t = attntrace.from_torch(model, x, layer=0, position_ids=pos, attention_mask=am)
    np.testing.assert_allclose(t.output, y, rtol=0, atol=TOL)
    assert t.step("Q_rope", 1).details["positions"] == (3, 4, 5, 6, 7) or list(t.step("Q_rope", 1).details["positions"]) == [3, 4, 5, 6, 7]


def test_rope_float64_false_uses_hugging_faces_float32_angles():
    """rope_float64=False (start="qkv") reproduces the unmodified module's float32 angles: the
    output then equals the module run with SDPA and its own float32 rotary module at 1e-10."""
    seed = 1
    ref32 = oracles.llama_attention_layer(seed, rope_float64=False)
    model, _ = _llama(seed)
    attn = model.layers[0].self_attn
    for given in (model, attn):  # the model's rotary module, or one built from the layer's config
        t = attntrace.from_hf_llama_attention(given, ref32["x"], start="qkv", rope_float64=False)
        np.testing.assert_allclose(t.output, ref32["output"], rtol=0, atol=TOL)
    assert attntrace.from_torch(attn, ref32["x"], start="qkv", rope_float64=False).to_dict() == t.to_dict()
    t64 = attntrace.from_torch(attn, ref32["x"], start="qkv")
    assert 1e-10 < np.abs(t64.output - ref32["output"]).max() < 1e-6
    with pytest.raises(BadInput, match=r"only start=\"qkv\""):
        attntrace.from_torch(attn, ref32["x"], rope_float64=False)


def test_json_has_output_and_blocks():
    d = json.loads(json.dumps(_online().to_dict()))
    assert d["output"] == "Z"


def test_rope_float64_false_on_a_layer_is_one_line():
    model, x, _ = ob.hf_llama_decoder_layer(seed=7)
    with pytest.raises(Unsupported, match=r"^rope_float64=False: a traced layer turns q and k with RoPE itself") as info:
        attntrace.from_torch(model, x, layer=0, rope_float64=False)
    assert "\n" not in str(info.value)
    with pytest.raises(BadInput, match="has no rotary embedding"):
        attntrace.from_torch(ob.tiny_gpt2(seed=0), np.zeros((3, 8)), layer=0, rope_float64=False)


# -- torch's additive float masks: the bias step ------------------------------------------------------
def _float_mask(L, S, seed, heads=None):
    """Random finite biases with some -inf (never a whole row), as torch adds them to the scores."""
    rng = np.random.default_rng(seed)
    shape = (L, S) if heads is None else (heads, L, S)
    m = rng.standard_normal(shape) * 2
    m[..., 0, 1:] = -np.inf  # row 1 keeps key 1 only
    m[..., 2, 1] = -np.inf
    return torch.tensor(m)


def test_multihead_attention_float_mask_is_a_bias_step():
    torch.manual_seed(1)
    m = torch.nn.MultiheadAttention(8, 2, batch_first=True, dtype=torch.float64).eval()
    x = _x(4, 8, 5)
    mask = _float_mask(4, 4, 0)
    t = attntrace.from_torch(m, x, attn_mask=mask)
    with torch.no_grad():
        out, w = m(x, x, x, attn_mask=mask, average_attn_weights=False)
    np.testing.assert_allclose(t.output, out[0].numpy(), rtol=0, atol=TOL)
    for h in (1, 2):
        np.testing.assert_allclose(t.step("weights", h).value, w[0, h - 1].numpy(), rtol=0, atol=TOL)
        bias = t.step("bias", h)
        np.testing.assert_array_equal(bias.details["bias"], np.where(np.isneginf(mask.numpy()), 0, mask.numpy()))
        assert bias.inputs == ("scaled",)
    assert t.step("masked", 1).details["keep"][0].tolist() == [1, 0, 0, 0]


def test_sdpa_float_mask_per_head():
    rng = np.random.default_rng(3)
    q, k, v = (torch.tensor(rng.standard_normal((1, 2, 4, 3))) for _ in range(3))
    mask = _float_mask(4, 4, 1, heads=2)[None]  # (1, H, L, S), a different bias per head
    t = attntrace.from_qkv(q, k, v, attn_mask=mask)
    want = oracles.sdpa(q[0].numpy(), k[0].numpy(), v[0].numpy(), mask=mask[0].numpy())
    np.testing.assert_allclose(t.output, want.transpose(1, 0, 2).reshape(4, -1), rtol=0, atol=TOL)
    assert not np.array_equal(t.step("bias", 1).details["bias"], t.step("bias", 2).details["bias"])


def test_encoder_layer_float_src_mask():
    layer = ob.random_encoder_layer(8, 2, 16, seed=8)
    x = _x(4, 8, 6)
    mask = _float_mask(4, 4, 2)
    t = attntrace.from_torch(layer, x, src_mask=mask)
    with torch.enable_grad():  # the Python path: torch's fused no_grad kernel gives NaN for this float mask
        want = layer(x, src_mask=mask)[0].detach().numpy()
    assert np.isfinite(want).all()
    np.testing.assert_allclose(t.output, want, rtol=0, atol=TOL)


@pytest.mark.parametrize("mode", ["numeric", "exact", "symbolic", "shape"])
def test_attn_bias_spec_in_every_mode_and_format(mode):
    spec = {"Q": [[1, 0], [0, 1], [1, 1]], "K": [[1, 2], [0, 1], [1, 0]], "V": [[1, 0], [0, 1], [2, 2]],
            "attn_bias": [["1/2", 0, -1], [0, 0, "1/4"], [2, 1, 0]], "mask": "causal"}
    t = attntrace.run(spec, mode=mode)
    assert t.has("bias")
    for fmt in ("md", "tex", "text"):
        for lang in ("en", "zh"):
            text = attntrace.render(t, format=fmt, lang=lang)
            assert ("attention bias" in text.lower()) if lang == "en" else ("注意力偏置" in text)
    if mode == "exact":
        import sympy as sp

        num = attntrace.run(spec, mode="numeric")
        np.testing.assert_allclose(np.array(t.step("weights").value.evalf(30), dtype=float), num.step("weights").value, atol=1e-14)
        assert t.step("bias").value[0, 0] == sp.Rational(1, 2) + sp.Rational(1, 1) / sp.sqrt(2)


def test_attn_bias_is_checked_with_carry_forward():
    spec = {"scores": [[1.0, 2.0], [0.5, 0.0]], "scale": False, "attn_bias": [[0.5, -1.0], [0.0, 2.0]]}
    t = attntrace.run(spec)
    right = t.step("bias").value.round(4).tolist()
    assert attntrace.check(spec, {"bias": right}).ok
    wrong = attntrace.check(spec, {"bias": [[1.0, 2.0], [0.5, 0.0]]})  # the bias forgotten
    assert not wrong.ok and wrong.first_wrong == "bias"


@pytest.mark.parametrize("extra, message", [
    ({"attn_bias": [[0, 1], [1, 0]], "alibi": True}, "alibi or attn_bias, not both"),
    ({"attn_bias": [[0, 1, 2], [1, 0, 2]]}, "attn_bias is 2 x 3 but the scores are 2 x 2"),
    ({"attn_bias": [[[0, 1], [1, 0]]] * 3, "num_heads": 2}, "attn_bias lists 3 matrices but there are 2 heads"),
    ({"attn_bias": [[0, float("inf")], [1, 0]]}, r"attn_bias\[1,2\] is inf; inputs must be finite"),
])
def test_bad_attn_bias_is_one_line(extra, message):
    spec = {"Q": [[1, 0, 1, 0], [0, 1, 0, 1]], "K": [[1, 0, 0, 0], [0, 1, 1, 0]], "V": [[1, 0, 0, 0], [0, 1, 0, 0]], **extra}
    with pytest.raises(BadInput, match=message) as info:
        attntrace.run(spec)
    assert "\n" not in str(info.value)


# -- answer files name an online block ------------------------------------------------------------------
def test_answer_file_checks_every_online_block():
    t = _online(block_queries=2)
    spec_t = t
    answer = {}
    for s in t.steps:
        if s.id in ("online_max", "online_sum") and s.details.get("query_block") == 1:
            answer[f"{s.id}#1.{s.details['block']}"] = s.value.round(4).tolist()
    answer["online_max#2.1"] = t.step("online_max", query_block=2, block=1).value.round(4).tolist()
    report = attntrace.check(spec_t, answer)
    assert report.ok and len(report.steps) == len(answer)
    # block 2's running sum not updated (the student wrote block 1's again): found in block 2, not in the last block
    bad = dict(answer)
    bad["online_sum#1.2"] = answer["online_sum#1.1"]
    report = attntrace.check(spec_t, bad)
    assert not report.ok and report.first_wrong == "online_sum#1.2"
    assert [s.key for s in report.steps if s.status == "wrong"] == ["online_sum#1.2"]
    assert report.step("online_sum#1.2").diagnosis.code == "unknown"  # no mistake is planted per block: named, not guessed
    assert "online_sum#1.2" in report.render("text")


def test_answer_block_key_spellings():
    t = _online()  # one query block: online_max#2
    want = t.step("online_max", block=2).value.round(4).tolist()
    for key in ("online_max#2", "online_max#1.2"):
        assert attntrace.check(t, {key: want}).ok
    with pytest.raises(BadInput, match="no step online_max#9"):
        attntrace.check(t, {"online_max#9": want})
    d = t.to_dict()
    assert [s["address"] for s in d["steps"] if s["id"] == "online_max"] == ["online_max#1", "online_max#2", "online_max#3"]


def test_answer_block_key_with_heads():
    rng = np.random.default_rng(5)
    spec = {"Q": rng.standard_normal((3, 4)).round(2).tolist(), "K": rng.standard_normal((3, 4)).round(2).tolist(),
            "V": rng.standard_normal((3, 4)).round(2).tolist(), "num_heads": 2, "online": {"block_keys": 2}}
    t = attntrace.run(spec)
    want = t.step("online_sum", 2, block=1).value.round(4).tolist()
    for key in ("online_sum#1@2", "online_sum@2#1"):
        report = attntrace.check(spec, {key: want})
        assert report.ok and report.steps[0].key == "online_sum#1@2"


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_attn_bias_report_parses_in_katex_and_compiles(lang, katex, xelatex):
    """The bias step's math through real KaTeX (Markdown) and a whole report through xelatex."""
    from mathcheck import markdown_math_spans

    spec = {"Q": [[1, 0], [0, 1], [1, 1]], "K": [[1, 2], [0, 1], [1, 0]], "V": [[1, 0], [0, 1], [2, 2]], "num_heads": 2,
            "attn_bias": [[[0.5, 0, -1], [0, 0, 0.25], [2, 1, 0]], [[0, 0, 0], [1, 0, 0], [2, 1, 0]]], "mask": "causal"}
    t = attntrace.run(spec, mode="exact")
    md = attntrace.render(t, format="md", lang=lang)
    assert katex(markdown_math_spans(md)) == []
    ok, log, _ = xelatex(attntrace.render(t, format="tex", lang=lang, standalone=True))
    assert ok, log
