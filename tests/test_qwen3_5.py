"""Qwen3.5's gated DeltaNet (handformer/families/qwen3_5.py) and its states in the cache: the loop over
time equals the chunked form; a prompt run in pieces through the cache gives the logits of one run;
regroup and reorder select the rows' states; truncate refuses what a state cannot forget, and chat
runs the context again instead; the prefix cache is refused; LoRA finds the new projections.
Transformers' parity (logits, left padding, greedy, served, export) is in test_hf_families and
test_hf_export; this model is handformer's own, built from a config."""

import dataclasses

import pytest
import torch

from handformer.config import CausalLMConfig, DeltaNetConfig, FamilyConfig
from handformer.families import build_causal_lm
from handformer.families.qwen3_5 import GatedDeltaNet, chunked_delta_rule, delta_rule, l2_normed
from handformer.generation.cache import DecodingCache
from handformer.generation.generate import generate

pytestmark = pytest.mark.usefixtures("one_thread")

CFG = CausalLMConfig.llama_style(
    vocab_size=50, d_model=36, n_heads=3, n_kv_heads=1, head_dim=12, d_ff=40, n_layers=3, max_positions=64,
    norm="rmsnorm_offset", qk_norm="head", rope_fraction=0.5, family=FamilyConfig(attn_output_gate=True),
    deltanet=DeltaNetConfig(layers=[0, 2], key_heads=2, value_heads=4, key_dim=6, value_dim=5, conv_kernel=3))


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    model = build_causal_lm(CFG).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith(("norm.weight", "A_log", "dt_bias")):
                p.normal_(0, 0.2)
    return model


def _ids(rows, length, seed=1):
    return torch.randint(3, 50, (rows, length), generator=torch.Generator().manual_seed(seed))


def test_the_chunked_delta_rule_equals_the_loop_over_time():
    """150 positions (chunks of 64, 64 and 22) from a carried state: outputs and final state equal."""
    g = torch.Generator().manual_seed(0)
    B, T, H, Dk, Dv = 2, 150, 3, 8, 5
    q, k = (l2_normed(torch.randn(B, T, H, Dk, generator=g)) for _ in range(2))
    v = torch.randn(B, T, H, Dv, generator=g)
    decay, beta = -torch.rand(B, T, H, generator=g), torch.rand(B, T, H, generator=g)
    state = torch.randn(B, H, Dk, Dv, generator=g)
    out, last = delta_rule(q * Dk ** -0.5, k, v, decay, beta, state)
    for chunk in (64, 7):
        chunked, chunked_last = chunked_delta_rule(q * Dk ** -0.5, k, v, decay, beta, state, chunk=chunk)
        torch.testing.assert_close(chunked, out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(chunked_last, last, atol=1e-5, rtol=1e-5)
    assert out.abs().max() > 0.5


@torch.no_grad()
def test_the_model_with_the_loop_equals_it_chunked(model, monkeypatch):
    ids = _ids(2, 20)
    chunked = model(ids).logits
    monkeypatch.setattr(GatedDeltaNet, "chunked", False)
    torch.testing.assert_close(model(ids).logits, chunked, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_a_prompt_run_in_pieces_through_the_cache_gives_the_logits_of_one_run(model):
    """Pieces of 4, 1, 2 and 7 positions (the convolution's state spans 2): the states carry over."""
    ids = _ids(2, 14)
    whole = model(ids).logits
    cache = model.new_cache(20)
    pieces = [model(ids[:, a:b], cache=cache).logits for a, b in ((0, 4), (4, 5), (5, 7), (7, 14))]
    torch.testing.assert_close(torch.cat(pieces, dim=1), whole, atol=1e-5, rtol=1e-5)
    conv, state = cache.states[0]
    assert conv.shape == (2, 2 * 2 * 6 + 4 * 5, 2) and state.shape == (2, 4, 6, 5) and cache.keys[0] is None


@torch.no_grad()
def test_reorder_and_regroup_select_each_rows_state(model):
    ids = _ids(3, 9)
    cache = DecodingCache(CFG.n_layers, 12)
    model(ids, cache=cache)
    nxt = _ids(3, 1, seed=2)
    expected = model(torch.cat([ids, nxt], 1)).logits[:, -1]  # (3, V)
    index = torch.tensor([2, 0, 2])
    cache.reorder(index)
    torch.testing.assert_close(model(nxt[index], cache=cache).logits[:, -1], expected[index], atol=1e-5, rtol=1e-5)
    assert cache.rows == 3
    prefill, alone = model.new_cache(12), model.new_cache(12)
    model(ids, cache=prefill)
    model(ids[1:2], cache=alone)
    regrouped = DecodingCache.regroup([(alone, torch.tensor([0])), (prefill, torch.tensor([2]))], 9, 12)
    got = model(nxt[[1, 2]], cache=regrouped).logits[:, -1]
    torch.testing.assert_close(got, expected[[1, 2]], atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_truncate_refuses_what_a_state_cannot_forget(model):
    ids = _ids(1, 8)
    cache = model.new_cache(20)
    model(ids, cache=cache)
    with pytest.raises(ValueError, match="a state cannot forget positions; truncate to 0"):
        cache.truncate(5)
    cache.truncate(8)  # its own length: nothing to forget
    cache.truncate(0)
    assert cache.length == 0 and not cache.keeps_states
    torch.testing.assert_close(model(ids, cache=cache).logits, model(ids).logits, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_a_chat_runs_the_context_again_where_the_cache_cannot_be_cut(model):
    """A chat keeps its cache across turns and cuts it back to what the next prompt shares; here
    it runs the whole prompt again instead, and each turn's tokens are those of its prompt alone."""
    from handformer.data.tokenizer import Tokenizer
    from handformer.generation.chat import ChatSession
    from handformer.generation.chat_template import ChatTemplate
    from handformer.generation.engine import SamplingOptions

    session = ChatSession(model, Tokenizer.train_char(["abc"]), ChatTemplate("{{ messages }}", {}), [2],
                          sampling=SamplingOptions(temperature=0), max_new_tokens=5)
    first = _ids(1, 9)[0].tolist()
    second = first[:4] + _ids(1, 6, seed=3)[0].tolist()  # shares 4 positions, not the cache's 13
    for prompt in (first, second):
        assert session._generate(prompt, None) == generate(model, [prompt], 5, temperature=0, stop_tokens=[2])[0]


def test_the_prefix_cache_is_refused_and_serve_runs_without_one(model):
    import threading

    from handformer.generation.engine import Engine
    from handformer.generation.prefix_cache import PrefixCache
    from handformer.serve.engine import BatchEngine

    with pytest.raises(ValueError, match="linear-attention layers keep one state a row"):
        Engine(model, prefix_cache=PrefixCache(2**20))
    assert BatchEngine(model, threading.Lock(), prefix_cache_mb=16).prefix_cache is None


def test_lora_targets_name_the_deltanet_projections(model):
    import copy

    from handformer.adapters.lora import LoRAConfig, add_lora

    names = add_lora(copy.deepcopy(model), LoRAConfig(rank=2, targets="all-linear"))
    assert {n.rsplit(".", 1)[-1] for n in names if n.startswith("layers.0.")} == {
        "qkv_proj", "z_proj", "beta_proj", "decay_proj", "out_proj", "gate_proj", "up_proj", "down_proj"}
    assert {n.rsplit(".", 1)[-1] for n in names if n.startswith("layers.1.self_attn")} == {
        "q_proj", "k_proj", "v_proj", "o_proj"}


GGUF_CFG = dataclasses.replace(CFG, deltanet=dataclasses.replace(CFG.deltanet, value_dim=6))  # llama.cpp's Dv = Dk


def test_gguf_both_ways_in_llama_cpps_qwen35_layout(model, tmp_path, capsys):
    """export-gguf writes llama.cpp's qwen35 names, shapes and keys (the gguf package's tables), A as
    -exp(A_log) and the value heads tiled; import-gguf reads it back to the same weights and logits,
    bit for bit. A run whose value heads are not as wide as its key heads is refused by name."""
    import gguf

    from handformer.cli import main
    from handformer.convert.gguf_file import read_gguf
    from handformer.data.special_tokens import SpecialTokens
    from handformer.data.tokenizer import Tokenizer
    from handformer.tasks.lm.run import load_lm, save_lm_run

    tokenizer = Tokenizer.train_char(["".join(chr(97 + i) for i in range(26)) + " .,!?'"])
    save_lm_run(tmp_path / "bad", model, tokenizer, SpecialTokens(eos_id=2, pad_id=0))
    assert main(["export-gguf", str(tmp_path / "bad"), str(tmp_path / "bad.gguf")]) == 2
    assert "deltanet.value_dim=5 (llama.cpp's Qwen3.5 makes a DeltaNet value head" in capsys.readouterr().err
    torch.manual_seed(3)
    run = build_causal_lm(GGUF_CFG).eval()
    with torch.no_grad():
        for p in run.parameters():
            p.normal_(0, 0.3)
    save_lm_run(tmp_path / "run", run, tokenizer, SpecialTokens(eos_id=2, pad_id=0))
    assert main(["export-gguf", str(tmp_path / "run"), str(tmp_path / "m.gguf")]) == 0
    file = read_gguf(tmp_path / "m.gguf")
    known = {gguf.TENSOR_NAMES[t].format(bid=i) for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.QWEN35] for i in range(3)}
    assert {n.removesuffix(".weight").removesuffix(".bias") for n in file.tensors} <= known
    C, D = 2 * 2 * 6 + 4 * 6, 36  # conv channels: q, k (2 heads of 6) and v (4 heads of 6)
    shapes = {"blk.0.attn_qkv.weight": (C, D), "blk.0.attn_gate.weight": (24, D), "blk.0.ssm_conv1d.weight": (C, 3),
              "blk.0.ssm_a": (4,), "blk.0.ssm_dt.bias": (4,), "blk.0.ssm_alpha.weight": (4, D),
              "blk.0.ssm_norm.weight": (6,), "blk.0.ssm_out.weight": (D, 24), "blk.1.attn_q.weight": (72, D),
              "blk.1.attn_q_norm.weight": (12,), "blk.1.post_attention_norm.weight": (D,)}
    assert {n: tuple(file.tensors[n].shape) for n in shapes} == shapes
    keys = {k.format(arch="qwen35"): v for k, v in {
        gguf.Keys.SSM.CONV_KERNEL: 3, gguf.Keys.SSM.STATE_SIZE: 6, gguf.Keys.SSM.GROUP_COUNT: 2,
        gguf.Keys.SSM.TIME_STEP_RANK: 4, gguf.Keys.SSM.INNER_SIZE: 24, gguf.Keys.Rope.DIMENSION_COUNT: 6,
        gguf.Keys.Rope.DIMENSION_SECTIONS: [1, 1, 1, 0],
        "{arch}.attention.recurrent_layers": [True, False, True]}.items()}  # the key gguf 0.19 lacks
    assert {k: file.metadata[k] for k in keys} == keys
    attn = run.layers[0].self_attn
    tiled = [0, 2, 1, 3]  # value heads: key head 0's are 0, 1 (handformer) and 0, 2 (llama.cpp)
    assert torch.equal(file.tensors["blk.0.ssm_a"].to_torch(), -attn.A_log.detach()[tiled].exp())
    gate = attn.z_proj.weight.detach().view(4, 6, D)[tiled].reshape(24, D)
    assert torch.equal(file.tensors["blk.0.attn_gate.weight"].to_torch(), gate)
    assert torch.equal(file.tensors["blk.0.ssm_norm.weight"].to_torch(), attn.out_norm.weight.detach())  # w
    assert main(["import-gguf", str(tmp_path / "m.gguf"), str(tmp_path / "back")]) == 0
    back = load_lm(tmp_path / "back").model
    assert back.cfg == GGUF_CFG
    computed = {"A_log": torch.exp, "norm.weight": lambda w: 1 + w}  # the gains 1 + w, and exp(A_log), as computed
    for (key, a), b in zip(run.state_dict().items(), back.state_dict().values()):
        f = next((f for end, f in computed.items() if key.endswith(end) and "out_norm" not in key), None)
        assert torch.equal(f(a), f(b)) if f else torch.equal(a, b), key
    ids = _ids(2, 30)
    with torch.no_grad():
        assert torch.equal(back(ids).logits, run(ids).logits)
