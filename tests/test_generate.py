"""Generation for the decoder-only model: the KV cache against full forwards (GPT-2 and Llama
style), the logit filters and their order, batched left-padded decoding against one prompt at a
time, seeds, stop tokens, length and argument errors, and the `handformer generate` command."""

import io
import math

import pytest
import torch
from torch import nn

from handformer import cli
from handformer.config import CausalLMConfig
from handformer.data.special_tokens import SpecialTokens
from handformer.data.tokenizer import Tokenizer
from handformer.generation.generate import generate
from handformer.generation.sampling import (
    apply_temperature,
    filter_logits,
    next_tokens,
    top_k_filter,
    top_p_filter,
)
from handformer.generation.stream import TextStream
from handformer.models.causal_lm import CausalLM
from handformer.tasks.lm.run import load_lm, save_lm_run

VOCAB = 23
PRESETS = ["gpt2", "llama"]


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_config(preset: str, vocab: int = VOCAB, max_positions: int = 48) -> CausalLMConfig:
    size = dict(vocab_size=vocab, n_layers=2, d_model=32, n_heads=4, d_ff=48, dropout=0.0,
                max_positions=max_positions)
    if preset.startswith("gpt2"):
        # Learned positions. A tied head makes a tiny random model mostly repeat its last token, so
        # the generation tests use an untied one; the cache test also covers the tied one.
        return CausalLMConfig.gpt2_style(**size, tie_embeddings=preset == "gpt2-tied")
    return CausalLMConfig.llama_style(**size, n_kv_heads=2)  # rotary positions, GQA


def tiny_model(preset: str, seed: int = 0, scale: float = 3.0, **kw) -> CausalLM:
    """A random model with its matrices scaled up, so next-token distributions are far from flat
    and greedy choices are not decided by rounding."""
    torch.manual_seed(seed)
    model = CausalLM(tiny_config(preset, **kw))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(scale)
    return model.eval()


def probs_logits() -> torch.Tensor:
    return torch.tensor([0.5, 0.3, 0.1, 0.1]).log()


def kept(logits: torch.Tensor) -> set[int]:
    return set(torch.isfinite(logits).nonzero().flatten().tolist())


# --- the KV cache --------------------------------------------------------------------------


@pytest.mark.parametrize("preset", [*PRESETS, "gpt2-tied"])
@pytest.mark.parametrize("padded", [False, True])
def test_cached_logits_equal_full_forward_at_every_position(preset, padded):
    """Prefill in uneven chunks, then single tokens: every position's logits match one full forward."""
    model = tiny_model(preset)
    torch.manual_seed(1)
    B, T = 3, 14
    ids = torch.randint(0, VOCAB, (B, T))
    mask = torch.ones(B, T, dtype=torch.bool)
    if padded:
        mask[1, :4] = False  # left padding
        mask[2, :9] = False
    attention_mask = mask if padded else None
    with torch.no_grad():
        full = model(ids, attention_mask).logits  # (B, T, V)
        cache = model.new_cache(T)
        pieces, start = [], 0
        for size in (5, 3, 1, 1, 2, 1, 1):
            end = start + size
            pieces.append(model(ids[:, start:end], None if attention_mask is None
                                else attention_mask[:, :end], cache=cache).logits)
            start = end
        assert start == T and cache.length == T
        cached = torch.cat(pieces, dim=1)
    torch.testing.assert_close(cached[mask], full[mask], atol=1e-5, rtol=1e-5)


# --- logit filters -------------------------------------------------------------------------


def test_temperature_zero_is_argmax_and_scaling_divides():
    torch.manual_seed(0)
    logits = torch.randn(5, 11)
    cold = apply_temperature(logits, 0)
    assert torch.equal(torch.softmax(cold, -1).argmax(-1), logits.argmax(-1))
    assert torch.equal(torch.softmax(cold, -1), nn.functional.one_hot(logits.argmax(-1), 11).float())
    assert torch.equal(next_tokens(logits, temperature=0), logits.argmax(-1))
    ties = torch.tensor([[1.0, 3.0, 3.0, 0.0], [float("-inf"), 2.0, 5.0, 5.0], [7.0, 7.0, 7.0, 7.0]])
    assert next_tokens(ties, temperature=0).tolist() == [1, 2, 0]  # the first maximal index, as argmax
    torch.testing.assert_close(apply_temperature(logits, 2.0), logits / 2)
    assert torch.equal(apply_temperature(logits, 1.0), logits)


@pytest.mark.parametrize("p, expected", [(0.8, {0, 1}), (0.85, {0, 1, 2}), (1.0, {0, 1, 2, 3}),
                                         (0.5, {0}), (0.3, {0}), (1e-9, {0}), (0.95, {0, 1, 2, 3})])
def test_top_p_keeps_the_smallest_set_reaching_p(p, expected):
    out = top_p_filter(probs_logits(), p)
    assert kept(out) == expected
    assert torch.equal(out[list(expected)], probs_logits()[list(expected)])  # survivors unchanged


def test_top_p_works_per_row_and_in_any_vocabulary_order():
    logits = torch.stack([probs_logits(), probs_logits().flip(0)])
    out = top_p_filter(logits, 0.8)
    assert kept(out[0]) == {0, 1} and kept(out[1]) == {3, 2}


@pytest.mark.parametrize("k", [1, 2, 3, 4, 10])
def test_top_k_keeps_exactly_k(k):
    torch.manual_seed(0)
    logits = torch.randn(4, 9)
    out = top_k_filter(logits, k)
    for row in range(4):
        survivors = kept(out[row])
        assert len(survivors) == min(k, 9)
        assert survivors == set(logits[row].topk(min(k, 9)).indices.tolist())


def test_top_k_keeps_all_ties_at_the_boundary():
    logits = torch.tensor([3.0, 1.0, 2.0, 2.0, 0.0])
    assert kept(top_k_filter(logits, 2)) == {0, 2, 3}  # documented: ties at the k-th value survive
    assert kept(top_k_filter(logits, 3)) == {0, 2, 3}


def test_filters_never_leave_an_empty_set():
    torch.manual_seed(0)
    logits = torch.randn(50, 7) * 20
    for out in (top_p_filter(logits, 1e-12), top_k_filter(logits, 1),
                filter_logits(logits, 0.01, top_k=1, top_p=1e-12)):
        assert torch.equal(out.argmax(-1), logits.argmax(-1))
        assert (torch.isfinite(out).sum(-1) == 1).all()


def test_filter_order_is_temperature_then_top_k_then_top_p():
    logits = probs_logits()
    # Temperature before top-p: at t = 0.5 the probabilities become [.69, .25, .03, .03], so the
    # nucleus at p = 0.6 is {0}; measured before the temperature it would be {0, 1}.
    assert kept(top_p_filter(logits, 0.6)) == {0, 1}
    assert kept(filter_logits(logits, 0.5, top_p=0.6)) == {0}
    # Top-k before top-p: among the top 2, token 0 has probability .5/.8 = .625 >= .55, so the
    # nucleus is {0}; top-p first would keep {0, 1} (0.5 < 0.55), and top-k 2 would keep both.
    assert kept(filter_logits(logits, 1.0, top_k=2, top_p=0.55)) == {0}
    assert kept(top_k_filter(top_p_filter(logits, 0.55), 2)) == {0, 1}
    expected = top_p_filter(top_k_filter(apply_temperature(logits, 0.7), 3), 0.9)
    assert torch.equal(filter_logits(logits, 0.7, top_k=3, top_p=0.9), expected)


@pytest.mark.parametrize("call, match", [
    (lambda x: apply_temperature(x, -0.1), "temperature"),
    (lambda x: top_k_filter(x, 0), "top_k"),
    (lambda x: top_p_filter(x, 0.0), "top_p"),
    (lambda x: top_p_filter(x, 1.5), "top_p"),
])
def test_filter_arguments_are_checked(call, match):
    with pytest.raises(ValueError, match=match):
        call(probs_logits())


# --- generate ------------------------------------------------------------------------------


def greedy_reference(model: CausalLM, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding written out plainly: a full forward over the whole sequence every step."""
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt):]


PROMPTS = [[3, 7, 1], [5, 9, 2, 8, 11, 4, 6], [13], [2, 2, 17, 20, 1]]


@pytest.mark.parametrize("preset", PRESETS)
def test_batched_left_padded_greedy_equals_one_prompt_at_a_time(preset):
    model = tiny_model(preset)
    batched = generate(model, PROMPTS, 8, temperature=0, pad_id=0)
    uncached = generate(model, PROMPTS, 8, temperature=0, use_cache=False)
    for row, prompt in enumerate(PROMPTS):
        alone = generate(model, [prompt], 8, temperature=0)[0]
        assert batched[row] == alone == greedy_reference(model, prompt, 8)
    assert uncached == batched
    assert all(len(out) == 8 for out in batched)
    # The padding id is masked out: any valid id gives the same result.
    assert generate(model, PROMPTS, 8, temperature=0, pad_id=VOCAB - 1) == batched


@pytest.mark.parametrize("preset", PRESETS)
def test_use_cache_false_matches_cache_for_greedy(preset):
    model = tiny_model(preset, seed=3)
    prompts = [[1, 2, 3, 4], [5]]
    assert (generate(model, prompts, 12, temperature=0, use_cache=True)
            == generate(model, prompts, 12, temperature=0, use_cache=False))


def test_same_seed_same_samples_and_different_seeds_differ():
    model = tiny_model("gpt2", scale=1.0)  # flat-ish distributions: samples vary
    a = generate(model, PROMPTS, 10, seed=7)
    assert a == generate(model, PROMPTS, 10, seed=7)
    assert a == generate(model, PROMPTS, 10, seed=7, top_k=VOCAB, top_p=1.0)  # no-op filters
    assert a != generate(model, PROMPTS, 10, seed=8)
    assert a != generate(model, PROMPTS, 10, temperature=0)


def test_sampling_with_a_single_survivor_is_greedy():
    model = tiny_model("llama", scale=1.0)
    greedy = generate(model, PROMPTS, 6, temperature=0)
    assert generate(model, PROMPTS, 6, seed=1, top_k=1) == greedy
    assert generate(model, PROMPTS, 6, seed=2, top_p=1e-9) == greedy
    assert generate(model, PROMPTS, 6, seed=3, temperature=1e-4) == greedy


def test_sampling_follows_the_filtered_distribution():
    """One-step samples land only on top-k survivors, with frequencies near their probabilities."""
    model = tiny_model("gpt2", scale=1.0)
    prompt = [4, 9, 1]
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1]
    probs = torch.softmax(filter_logits(logits, 1.0, top_k=3), -1)
    n = 2000
    samples = generate(model, [prompt] * n, 1, seed=0, top_k=3)
    counts = torch.bincount(torch.tensor([s[0] for s in samples]), minlength=VOCAB).float()
    assert set(counts.nonzero().flatten().tolist()) <= kept(filter_logits(logits, 1.0, top_k=3))
    tolerance = 4 * math.sqrt(0.25 / n)  # 4 standard deviations at worst
    assert (counts / n - probs).abs().max() < tolerance


@pytest.mark.parametrize("preset", PRESETS)
def test_stop_tokens_end_a_row_and_nothing_follows(preset):
    model = tiny_model(preset)
    full = generate(model, PROMPTS, 10, temperature=0)
    stop = full[0][2]  # a token row 0 produces at step 3
    streamed = {row: [] for row in range(len(PROMPTS))}
    outs = generate(model, PROMPTS, 10, temperature=0, stop_tokens=[stop, VOCAB - 1],
                    on_token=lambda row, token: streamed[row].append(token))
    for row, out in enumerate(outs):
        cut = [i for i, t in enumerate(full[row]) if t in (stop, VOCAB - 1)]
        expected = full[row][: cut[0] + 1] if cut else full[row]
        assert out == expected  # the stop token is included, nothing after it
        assert streamed[row] == out
    assert len(outs[0]) <= 3 and outs[0][-1] == stop


def test_all_rows_stopping_ends_generation_early():
    model = tiny_model("gpt2")
    first = generate(model, [[5]], 1, temperature=0)[0][0]
    calls = []
    out = generate(model, [[5], [5]], 30, temperature=0, stop_tokens=[first],
                   on_token=lambda row, token: calls.append((row, token)))
    assert out == [[first], [first]] and calls == [(0, first), (1, first)]


def test_zero_new_tokens_returns_empty_rows():
    assert generate(tiny_model("gpt2"), PROMPTS, 0) == [[], [], [], []]


def test_generation_restores_the_training_flag():
    model = tiny_model("gpt2").train()
    generate(model, [[1, 2]], 2, temperature=0)
    assert model.training


@pytest.mark.parametrize("preset", PRESETS)
def test_generating_past_max_positions_is_a_clear_error(preset):
    model = tiny_model(preset, max_positions=16)
    # The last new token is returned without being fed back: 10 + 7 tokens use 16 positions.
    for use_cache in (True, False):
        assert len(generate(model, [[1] * 10], 7, temperature=0, use_cache=use_cache)[0]) == 7
        assert len(generate(model, [[1] * 16], 1, temperature=0, use_cache=use_cache)[0]) == 1
    assert generate(model, [[1] * 16], 1, temperature=0) == generate(model, [[1] * 16], 1, temperature=0,
                                                                      use_cache=False)
    with pytest.raises(ValueError, match=r"10 tokens plus max_new_tokens=8.*17 positions.*"
                                         r"max_positions=16.*at most 7"):
        generate(model, [[1] * 10, [2]], 8)
    with pytest.raises(ValueError, match=r"17 tokens plus max_new_tokens=1.*17 positions.*at most 0"):
        generate(model, [[1] * 17], 1)


@pytest.mark.parametrize("kwargs, match", [
    (dict(temperature=-1.0), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_k=0), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.01), "top_p"),
    (dict(pad_id=VOCAB), "pad_id"),
])
def test_generate_checks_its_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        generate(tiny_model("gpt2"), [[1, 2]], 3, **kwargs)


@pytest.mark.parametrize("prompts, match", [
    ([], "non-empty list"), ([1, 2, 3], "list of token-id lists"), ([[1], []], "prompt 1 is empty"),
])
def test_generate_rejects_bad_prompts(prompts, match):
    with pytest.raises(ValueError, match=match):
        generate(tiny_model("gpt2"), prompts, 3)


def test_generate_rejects_negative_max_new_tokens_and_out_of_vocabulary_prompts():
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(tiny_model("gpt2"), [[1]], -1)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        generate(tiny_model("gpt2"), [[1, VOCAB]], 2)


# --- the command line ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    tok = Tokenizer.train_char(["abcdef gh"])
    model = tiny_model("gpt2", vocab=tok.vocab_size, max_positions=32)
    run_dir = tmp_path_factory.mktemp("lm") / "run"
    save_lm_run(run_dir, model, tok, SpecialTokens(bos_id=tok.bos_id, eos_id=tok.eos_id,
                                                   pad_id=tok.pad_id))
    return run_dir


def expected_text(run_dir, prompt: str, n: int) -> str:
    run = load_lm(run_dir)
    ids = [run.tokens.bos_id] + run.tokenizer.encode(prompt)
    new = generate(run.model, [ids], n, temperature=0, stop_tokens=[run.tokens.eos_id])[0]
    assert new == greedy_reference(run.model, ids, len(new))
    return prompt + run.tokenizer.decode(new) + "\n"


def test_cli_generate_prints_the_greedy_continuation(lm_run, capsys):
    code = cli.main(["generate", str(lm_run), "--prompt", "ab", "--max-new-tokens", "5",
                     "--temperature", "0"])
    out = capsys.readouterr().out
    assert code == 0
    assert out == expected_text(lm_run, "ab", 5)


def test_cli_generate_reads_prompts_from_stdin(lm_run, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("ab\n\ncafe\n"))
    code = cli.main(["generate", str(lm_run), "--max-new-tokens", "4", "--temperature", "0"])
    assert code == 0
    assert capsys.readouterr().out == expected_text(lm_run, "ab", 4) + expected_text(lm_run, "cafe", 4)


def test_cli_generate_samples_reproducibly_and_stops_at_eos(lm_run, capsys):
    run = load_lm(lm_run)
    eos, ids = run.tokens.eos_id, [run.tokens.bos_id] + run.tokenizer.encode("fa")
    options = dict(temperature=1.5, top_k=5, top_p=0.9, stop_tokens=[eos])
    # A seed whose sample ends at EOS before the limit, so the default stop is exercised.
    seed, new = next((s, new) for s in range(200)
                     for new in generate(run.model, [ids], 12, seed=s, **options)
                     if len(new) < 12 and new[-1] == eos)
    args = ["generate", str(lm_run), "--prompt", "fa", "--max-new-tokens", "12", "--top-k", "5",
            "--top-p", "0.9", "--temperature", "1.5", "--seed", str(seed)]
    assert cli.main(args) == 0
    first = capsys.readouterr().out
    assert first == "fa" + run.tokenizer.decode(new) + "\n"
    assert cli.main(args) == 0
    assert capsys.readouterr().out == first


@pytest.mark.parametrize("extra, match", [
    (["--prompt", ""], "empty prompt"),
    (["--prompt", "ab", "--max-new-tokens", "40"], "max_positions=32"),
])  # an option out of range is the parser's (test_new_user.py)
def test_cli_generate_errors_exit_2(lm_run, capsys, extra, match):
    assert cli.main(["generate", str(lm_run), *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and match in captured.err


def test_cli_generate_default_length_fills_the_context_window(lm_run, capsys):
    """Without --max-new-tokens: 100 tokens or what fits (32 positions - BOS - 3 prompt tokens,
    + 1: the last new token is never fed back)."""
    run = load_lm(lm_run)
    ids = [run.tokens.bos_id] + run.tokenizer.encode("hgf")
    new = generate(run.model, [ids], 29, temperature=0, stop_tokens=[run.tokens.eos_id])[0]
    assert cli.main(["generate", str(lm_run), "--prompt", "hgf", "--temperature", "0"]) == 0
    assert capsys.readouterr().out == "hgf" + run.tokenizer.decode(new) + "\n"


def test_cli_generate_with_no_stdin_prompts_is_an_error(lm_run, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("\n  \n"))
    assert cli.main(["generate", str(lm_run)]) == 2
    assert "nothing to generate" in capsys.readouterr().err


def test_cli_generate_rejects_directories_that_are_not_lm_runs(tmp_path, capsys):
    assert cli.main(["generate", str(tmp_path), "--prompt", "ab"]) == 2
    assert "not a run directory" in capsys.readouterr().err
    (tmp_path / "config.json").write_text('{"task": "translation"}')
    assert cli.main(["generate", str(tmp_path), "--prompt", "ab"]) == 2
    assert "not a language model" in capsys.readouterr().err


def test_text_stream_holds_back_incomplete_utf8():
    """Byte-level BPE splits an unseen character into byte tokens; no half character is shown."""
    tok = Tokenizer.train_bpe(["hello world"] * 3, vocab_size=270)
    text = " h€llo ✓"
    ids = tok.encode(text)
    assert "\ufffd" in tok.decode(ids[:2]) or "\ufffd" in tok.decode(ids[:3])  # the test bites
    prompt = tok.encode("hello")
    out = io.StringIO()
    stream = TextStream(tok, prompt, prefix="hello", out=out)
    writes = []
    out.write = lambda s: writes.append(s)  # record each chunk as it is written
    for i in ids:
        stream.push(i)
    stream.close()
    assert "".join(writes) == "hello" + text
    assert all("\ufffd" not in w for w in writes)
    assert len(writes) > 3  # it streamed, rather than writing once at the end
    pieces = []  # a function instead of a file, and a decode of the caller's (as a chat's reply)
    stream = TextStream(tok, out=pieces.append, decode=lambda ids: tok.decode(ids).upper())
    for i in ids:
        stream.push(i)
    stream.close()
    assert "".join(pieces) == text.upper() and len(pieces) > 3
    assert all("\ufffd" not in p for p in pieces)
