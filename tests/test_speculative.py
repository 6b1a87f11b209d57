"""Speculative decoding (generation/speculative.py, in the one engine): greedy tokens identical to
plain decoding with prompt lookup and with a draft model; sampled tokens distributed as plain
decoding's (20,000 seeded two-token samples against the model's exact probabilities, by
chi-square), and a planted rule that keeps every guess caught by the same test; the KV cache cut
back so that every kept token saw exactly its context; log-probabilities as plain decoding's;
what it cannot do exactly refused with a reason (a grammar, a sliding window, a batch, serve)."""

from __future__ import annotations

import io
import json

import pytest
import torch
from test_chat import CHATML, _model, _tokenizer

from handformer import cli
from handformer.config import CausalLMConfig
from handformer.data.special_tokens import SpecialTokens
from handformer.generation import engine as engine_module
from handformer.generation.engine import Engine, Row
from handformer.generation.generate import generate
from handformer.generation.sampling import SamplingOptions, Speculation
from handformer.generation.speculative import (
    DraftLength,
    SpeculationStats,
    accept_draft,
    accept_greedy,
    prompt_lookup,
)
from handformer.generation.speculative import sampled_probabilities as probabilities
from handformer.models.causal_lm import CausalLM
from handformer.serve.door import APIError, Fields
from handformer.tasks.lm.run import save_lm_run

pytestmark = pytest.mark.usefixtures("one_thread")
REPEAT = [5, 9, 2, 7, 3, 8, 5, 9, 2, 7, 3, 8, 5, 9, 2]  # repetitive: prompt lookup finds drafts


def tiny(vocab: int = 40, seed: int = 0, scale: float = 4.0, window: int | None = None) -> CausalLM:
    torch.manual_seed(seed)
    cfg = CausalLMConfig.llama_style(vocab_size=vocab, d_model=32, n_heads=4, n_kv_heads=2, d_ff=48,
                                     n_layers=2, max_positions=128, sliding_window=window)
    model = CausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(scale)  # less uniform logits
    return model


@pytest.fixture(scope="module")
def models():
    return tiny(), tiny(seed=1), tiny(seed=2, scale=1.0)  # the model, a draft that agrees little, a flat one


def test_prompt_lookup_takes_what_followed_the_latest_match():
    assert prompt_lookup([1, 2, 3, 4, 1, 2, 5, 6, 1, 2], 3, 2) == [5, 6, 1]  # the latest "1 2"
    assert prompt_lookup([1, 2, 3, 9, 3], 4, 3) == [9, 3, 9, 3]  # only "3" occurred before: "9 3", repeated
    assert prompt_lookup([7, 1, 1, 1], 3, 3) == [1, 1, 1]  # "1 1" one back: copies its own copy
    assert prompt_lookup([1, 2, 3], 4, 3) == []


def test_the_greedy_rule_is_the_acceptance_rule_at_temperature_zero():
    """accept_greedy (argmax per row, no probabilities) keeps what accept_draft keeps at temperature 0."""
    g = torch.Generator().manual_seed(0)
    greedy = SamplingOptions(0)
    for _ in range(200):
        logits = torch.randn(4, 6, generator=g)  # (K + 1, V), K = 3
        best = logits.argmax(-1).tolist()
        draft = [b if torch.rand((), generator=g) < 0.6 else (b + 1) % 6 for b in best[:3]]
        expected = accept_draft(probabilities(logits, greedy), draft, None, g)
        assert accept_greedy(logits, draft) == expected


@pytest.mark.parametrize("drafter", ["lookup", "draft", "self"])
def test_greedy_tokens_are_identical_to_plain_decoding(models, drafter):
    model, other, _ = models
    draft = {"lookup": None, "draft": other, "self": model}[drafter]
    for prompt, n, stop in ((REPEAT, 70, ()), ([3, 1], 40, ()), (REPEAT, 70, (8,))):
        plain = generate(model, [prompt], n, temperature=0, stop_tokens=stop)
        stats = SpeculationStats()
        fast = generate(model, [prompt], n, temperature=0, stop_tokens=stop,
                        speculate=Speculation(draft_model=draft), stats=stats)  # up to 7: the default
        assert fast == plain and stats.forwards > 0
    if drafter == "self":  # the model drafting for itself is always right
        assert stats.accepted == stats.drafted > 0


def test_the_draft_length_doubles_while_every_guess_is_kept_and_follows_a_rejection():
    length = DraftLength(7)
    seen = [length.next]
    for drafted, kept in ((7, 2), (3, 3), (6, 6), (7, 0), (1, 1), (2, 2), (4, 1)):
        length.update(drafted, kept)
        seen.append(length.next)
    assert seen == [7, 3, 6, 7, 1, 2, 4, 2]


@pytest.mark.parametrize("drafter", ["lookup", "draft"])
def test_each_step_drafts_what_the_last_one_kept_allows(models, drafter, monkeypatch):
    """The engine asks the drafter for DraftLength's count after each check (fewer near the end)."""
    model, _, flat = models
    spec = Speculation(tokens=5, draft_model=None if drafter == "lookup" else flat)
    checks = []  # (context length, guesses asked for, guesses drafted, guesses kept) of each check

    def recorded(logits, draft):
        tokens = accept_greedy(logits, draft)
        checks[-1] += (len(draft), len(tokens) - 1)
        return tokens

    monkeypatch.setattr(engine_module, "accept_greedy", recorded)
    row = Row(REPEAT, 60, SamplingOptions(0, speculate=spec))
    engine = Engine(model)
    engine.add([row])
    propose = engine.drafters[id(row)].propose

    def asked(context, k, *rest):
        checks.append((len(context), k))
        return propose(context, k, *rest)

    engine.drafters[id(row)].propose = asked
    with torch.inference_mode():
        while engine.step():
            pass
    length, end = DraftLength(5), len(REPEAT) + 60
    checks = [c for c in checks if len(c) == 4]  # the proposals that drafted something
    for context, k, drafted, kept in checks:
        assert k == drafted == min(length.next, end - context - 1)
        length.update(drafted, kept)
    assert checks[0][1] == 5 and any(kept < drafted for *_, drafted, kept in checks)


@torch.inference_mode()
def _run(model, prompt, n, options, keep_logits=False):
    row = Row(prompt, n, options, keep_logits=keep_logits)
    engine = Engine(model)
    choices = engine.add([row])
    while step := engine.step():
        choices += step
    return row, choices, engine


@pytest.mark.parametrize("drafter", ["lookup", "draft"])
def test_sampled_tokens_each_saw_exactly_their_context(models, drafter):
    """The kept guesses' keys stay in the cache, the rejected ones' are cut: every token's logits are
    those of a full forward over the prompt and the tokens before it."""
    model, _, flat = models
    spec = Speculation(tokens=3, draft_model=None if drafter == "lookup" else flat)
    row, choices, engine = _run(model, REPEAT, 60, SamplingOptions(1.0, seed=0, speculate=spec), keep_logits=True)
    full = model(torch.tensor([REPEAT + row.tokens])).logits[0, len(REPEAT) - 1:-1]  # (n, V)
    torch.testing.assert_close(torch.stack([c.logits for c in choices]), full, atol=1e-4, rtol=1e-4)
    stats = row.speculation
    assert 0 < stats.accepted < stats.drafted and engine.cache.length == len(REPEAT) + len(row.tokens) - 1


def test_log_probabilities_are_plain_decodings(models):
    model, other, _ = models
    plain = _run(model, REPEAT, 30, SamplingOptions(0, top_logprobs=3))[1]
    fast = _run(model, REPEAT, 30, SamplingOptions(0, top_logprobs=3, speculate=Speculation(draft_model=other)))[1]
    assert [c.token for c in fast] == [c.token for c in plain]
    for a, b in zip(fast, plain):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-4)
        assert [t for t, _ in a.top] == [t for t, _ in b.top]


# --- the distribution: 20,000 two-token samples against the exact probabilities ----------------------
N, VOCAB, OPTIONS = 20_000, 12, SamplingOptions(0.9, top_p=0.8)


@pytest.fixture(scope="module")
def exact():
    """A tiny model's sampled distributions after the prompt (V,) and after prompt + a, (V, V); a
    draft model's after the prompt; the exact two-token probabilities (V, V)."""
    model, draft = tiny(VOCAB, seed=3, scale=3.0), tiny(VOCAB, seed=4, scale=3.0)
    prompt = [1, 4, 6, 1, 4]  # prompt lookup drafts 6
    with torch.no_grad():
        first = probabilities(model(torch.tensor([prompt])).logits[0, -1], OPTIONS)  # (V,)
        ids = torch.tensor([prompt + [a] for a in range(VOCAB)])  # (V, T + 1)
        second = probabilities(model(ids).logits[:, -1], OPTIONS)  # (V, V): row a after a
        q = probabilities(draft(torch.tensor([prompt])).logits[0, -1], OPTIONS)  # (V,)
    return prompt, first, second, q, first[:, None] * second


def _speculated_pairs(rule, prompt, first, second, q, generator) -> list[tuple[int, int]]:
    """What the engine's speculative step emits from a one-guess draft (and, after a rejection,
    its plain step): the guess from prompt lookup (q None) or drawn from the draft model's q."""
    pairs = []
    for _ in range(N):
        if q is None:
            draft, proposal = prompt_lookup(prompt, 1, 3), None
        else:
            draft, proposal = [int(torch.multinomial(q, 1, generator=generator))], q[None]
        tokens = rule(torch.stack([first, second[draft[0]]]), draft, proposal, generator)
        if len(tokens) == 1:
            tokens.append(int(torch.multinomial(second[tokens[0]], 1, generator=generator)))
        pairs.append((tokens[0], tokens[1]))
    return pairs


def _p_value(pairs, probs: torch.Tensor) -> float:
    counts = torch.zeros(VOCAB, VOCAB)
    for a, b in pairs:
        counts[a, b] += 1
    if counts[probs == 0].sum() > 0:  # a pair the filters removed: impossible under the model
        return 0.0
    expected, observed = probs.flatten() * len(pairs), counts.flatten()
    big = expected >= 5  # the small cells pooled into one (when there are some)
    pooled = [expected[~big].sum()[None]] if expected[~big].sum() > 0 else []
    e = torch.cat([expected[big], *pooled])
    o = torch.cat([observed[big], *([observed[~big].sum()[None]] if pooled else [])])
    stat = ((o - e) ** 2 / e).sum().double()
    p = float(torch.special.gammaincc(torch.tensor((len(e) - 1) / 2, dtype=torch.double), stat / 2))  # chi2.sf
    print(f"chi-square {float(stat):.1f}, {len(e) - 1} degrees of freedom, p = {p:.3g}")
    return p


def _accept_every_guess(target, draft, proposal, generator):
    """A planted wrong rule: keeps every guess."""
    return [*draft, int(torch.multinomial(target[-1], 1, generator=generator))]


def test_sampling_with_and_without_speculation_matches_the_exact_probabilities(exact):
    prompt, first, second, q, probs = exact
    generator = torch.Generator().manual_seed(0)
    a = torch.multinomial(first.expand(N, -1), 1, generator=generator)[:, 0]  # plain decoding
    b = torch.multinomial(second[a], 1, generator=generator)[:, 0]
    assert _p_value(list(zip(a.tolist(), b.tolist())), probs) > 1e-3
    for drafts in (None, q):  # prompt lookup, a draft model
        pairs = _speculated_pairs(accept_draft, prompt, first, second, drafts, generator)
        assert _p_value(pairs, probs) > 1e-3


def test_the_chi_square_test_catches_a_rule_that_keeps_every_guess(exact):
    prompt, first, second, q, probs = exact
    generator = torch.Generator().manual_seed(0)
    for drafts in (None, q):
        pairs = _speculated_pairs(_accept_every_guess, prompt, first, second, drafts, generator)
        assert _p_value(pairs, probs) < 1e-3


# --- refusals ---------------------------------------------------------------------------------------
def test_what_speculation_cannot_do_exactly_is_refused(models):
    model = models[0]
    spec = SamplingOptions(0, speculate=Speculation())
    with pytest.raises(ValueError, match="grammar or other logit processors"):
        Engine(model).add([Row(REPEAT, 5, spec, processors=(lambda tokens, logits: logits,))])
    with pytest.raises(ValueError, match="sliding-window model's cache rolls"):
        generate(tiny(window=8), [REPEAT], 5, speculate=Speculation())
    with pytest.raises(ValueError, match="one prompt at a time"):
        generate(model, [REPEAT, REPEAT], 5, speculate=Speculation())
    with pytest.raises(ValueError, match="vocabulary of 12 tokens but the model has 40"):
        generate(model, [REPEAT], 5, speculate=Speculation(draft_model=tiny(12)))
    with pytest.raises(ValueError, match=r"speculate.tokens .* >= 1, got 0"):
        Speculation(tokens=0)
    for name in ("speculate", "prediction"):
        with pytest.raises(APIError, match="speculative decoding is not served") as err:
            Fields({"model": "m", name: 4}, {"model"})
        assert err.value.status == 400 and name in str(err.value)


# --- the CLI: generate and chat ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tok = _tokenizer()
    path = tmp_path_factory.mktemp("spec") / "run"
    save_lm_run(path, _model(tok.vocab_size), tok, SpecialTokens(eos_id=None, pad_id=tok.pad_id))
    (path / "chat_template.jinja").write_text(CHATML)
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    return path


def test_cli_generate_and_chat_speculate_with_the_same_tokens(run_dir, capsys, monkeypatch):
    prompt = ["generate", str(run_dir), "--prompt", "the lazy dog. the lazy dog. the lazy", "--temperature", "0",
              "--max-new-tokens", "30"]
    for args in (prompt, ["chat", str(run_dir), "--temperature", "0", "--max-new-tokens", "20"]):
        outs = []
        for extra in ([], ["--speculate", "3"], ["--draft", str(run_dir)]):
            monkeypatch.setattr("sys.stdin", io.StringIO("Hello, who are you?\nthe lazy dog\n"))
            assert cli.main(args + extra) == 0
            outs.append(capsys.readouterr())
        assert outs[0].out == outs[1].out == outs[2].out
        assert "speculation:" not in outs[0].err
        assert "drafted tokens accepted" in outs[1].err and "tokens per forward" in outs[2].err
