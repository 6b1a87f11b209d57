"""Greedy and beam search on tiny random models: batching, caching, EOS handling, length limits,
determinism, and beam search against exhaustive search under the same length-penalized score."""

import itertools
import re

import helpers
import pytest
import torch
from helpers import scaled_seq2seq

from handformer.config import Seq2SeqConfig
from handformer.generation.decoding import DecodeLimits, beam_search, best_reachable, greedy_decode
from handformer.models.seq2seq import Seq2SeqTransformer

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SEEDS = range(6)


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_model(seed: int, vocab: int = 6, scale: float = 2.5, dropout: float = 0.0,
               norm_placement: str = "post") -> Seq2SeqTransformer:
    """A random model with its matrices scaled up, so next-token distributions are far from flat."""
    return scaled_seq2seq(seed, vocab=vocab, scale=scale, n_decoder_layers=1, max_positions=16,
                          dropout=dropout, norm_placement=norm_placement)


def random_sources(seed: int, lengths: list[int], vocab: int = 6) -> torch.Tensor:
    """(B, S) right-padded sources of the given real lengths (EOS included), content tokens >= 3."""
    return helpers.random_sources(seed, lengths, vocab, PAD, EOS, UNK)


def unpadded(src: torch.Tensor, i: int) -> torch.Tensor:
    """Row i of a padded batch as a batch of one, without its padding."""
    return src[i: i + 1, : int((src[i] != PAD).sum())]


def until_eos(row: list[int]) -> list[int]:
    return row[: row.index(EOS) + 1] if EOS in row else row


LIMITS = DecodeLimits(BOS, EOS, PAD, max_len_a=1.0, max_len_b=2)
LENGTHS = [5, 2, 7, 3]  # sources of different lengths in one padded batch


# --- greedy -------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_batched_greedy_equals_one_sentence_at_a_time(seed):
    model = tiny_model(seed)
    src = random_sources(seed, LENGTHS)
    batched = greedy_decode(model, src, LIMITS).tolist()
    for i in range(len(LENGTHS)):
        alone = greedy_decode(model, unpadded(src, i), LIMITS)[0].tolist()
        assert until_eos(batched[i]) == alone


@pytest.mark.parametrize("seed", SEEDS)
def test_greedy_ends_each_row_with_one_eos_then_only_padding(seed):
    model = tiny_model(seed)
    src = random_sources(seed, LENGTHS)
    out = greedy_decode(model, src, LIMITS)
    max_lens = LIMITS.max_lengths(src, model.cfg.max_positions).tolist()
    for row, max_len in zip(out.tolist(), max_lens):
        assert row.count(EOS) == 1
        end = row.index(EOS)
        assert end < max_len
        assert all(t == PAD for t in row[end + 1:])
        assert PAD not in row[:end] and BOS not in row[:end]  # never emitted as real output


@pytest.mark.parametrize("seed", SEEDS)
def test_greedy_cached_equals_uncached(seed):
    model = tiny_model(seed, norm_placement="pre")
    src = random_sources(seed, LENGTHS)
    assert torch.equal(greedy_decode(model, src, LIMITS, use_cache=True),
                       greedy_decode(model, src, LIMITS, use_cache=False))


def suppress_eos(model: Seq2SeqTransformer):
    """A hook that makes EOS very unlikely, so only the length limit ends a hypothesis."""
    def hook(module, inputs, output):
        output = output.clone()
        output[..., EOS] -= 100.0
        return output
    return model.generator.register_forward_hook(hook)


def test_outputs_may_use_every_position_of_the_decoder():
    """An output of m tokens feeds the decoder BOS + m - 1 tokens, so with no EOS in sight the
    output ends at max_positions tokens (not one fewer), cached or not, greedy and beam."""
    model = tiny_model(0)
    suppress_eos(model)
    src = random_sources(0, LENGTHS)
    limits = DecodeLimits(BOS, EOS, PAD, max_len_a=1.0, max_len_b=100)
    P = model.cfg.max_positions
    assert limits.max_lengths(src, P).tolist() == [P] * len(LENGTHS)
    for use_cache in (True, False):
        out = greedy_decode(model, src, limits, use_cache=use_cache).tolist()
        assert all(len(until_eos(row)) == P and row[P - 1] == EOS for row in out)
        hyps = beam_search(model, src, limits, beam_size=2, use_cache=use_cache)
        assert all(len(hyp) == P and hyp[-1] == EOS for hyp in hyps)


def test_the_length_limit_forces_eos_per_sentence():
    model = tiny_model(0)
    suppress_eos(model)
    src = random_sources(0, LENGTHS)
    limits = DecodeLimits(BOS, EOS, PAD, max_len_a=1.0, max_len_b=1)
    out = greedy_decode(model, src, limits).tolist()
    beams = beam_search(model, src, limits, beam_size=3)
    for row, hyp, n in zip(out, beams, LENGTHS):
        assert len(until_eos(row)) == n + 1 and row[n] == EOS  # a * source length + b tokens
        assert len(hyp) == n + 1 and hyp[-1] == EOS and EOS not in hyp[:-1]


# --- beam search --------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("beam_size", [2, 5])
def test_beam_cached_equals_uncached(seed, beam_size):
    model = tiny_model(seed, norm_placement="pre" if seed % 2 else "post")
    src = random_sources(seed, LENGTHS)
    assert (beam_search(model, src, LIMITS, beam_size, use_cache=True)
            == beam_search(model, src, LIMITS, beam_size, use_cache=False))


@pytest.mark.parametrize("seed", SEEDS)
def test_beam_of_one_is_greedy(seed):
    """With length_penalty 0 the score is the summed log-probability, which greedy maximizes step
    by step; a beam of one must make the same choices. (With a length penalty, beam search may
    keep looking past a finished hypothesis that a longer one could still beat.)"""
    model = tiny_model(seed)
    src = random_sources(seed, LENGTHS)
    greedy = [until_eos(row) for row in greedy_decode(model, src, LIMITS).tolist()]
    assert beam_search(model, src, LIMITS, beam_size=1, length_penalty=0.0) == greedy


@pytest.mark.parametrize("seed", SEEDS)
def test_batched_beam_equals_one_sentence_at_a_time(seed):
    model = tiny_model(seed)
    src = random_sources(seed, LENGTHS)
    batched = beam_search(model, src, LIMITS, beam_size=3)
    for i in range(len(LENGTHS)):
        assert beam_search(model, unpadded(src, i), LIMITS, beam_size=3) == [batched[i]]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("beam_size", [1, 3, 8])
def test_finished_hypotheses_are_never_extended(seed, beam_size):
    model = tiny_model(seed)
    src = random_sources(seed, LENGTHS)
    max_lens = LIMITS.max_lengths(src, model.cfg.max_positions).tolist()
    for hyp, max_len in zip(beam_search(model, src, LIMITS, beam_size), max_lens):
        assert hyp.count(EOS) == 1 and hyp[-1] == EOS
        assert 1 <= len(hyp) <= max_len
        assert PAD not in hyp and BOS not in hyp


def sequence_scores(model: Seq2SeqTransformer, src: torch.Tensor, seqs: list[list[int]]) -> torch.Tensor:
    """Summed log-probabilities of complete outputs (each ending in EOS, all of one length) for a
    (1, S) source, by teacher forcing the whole sequence through the model in one pass."""
    tgt_out = torch.tensor(seqs)  # (N, L)
    tgt_in = torch.cat([torch.full((len(seqs), 1), BOS), tgt_out[:, :-1]], dim=1)  # (N, L)
    with torch.no_grad():
        logits = model(src.expand(len(seqs), -1), tgt_in).logits  # (N, L, V)
    return logits.float().log_softmax(-1).gather(-1, tgt_out[..., None]).squeeze(-1).sum(-1)  # (N,)


def exhaustive_search(model, src, vocab: int, max_len: int, alpha: float) -> list[tuple[float, list[int]]]:
    """Every valid output (content tokens, then EOS; at most max_len tokens), scored by
    sum of log-probabilities / length^alpha, best first."""
    content = [t for t in range(vocab) if t not in (PAD, BOS, EOS)]
    scored = []
    for length in range(1, max_len + 1):
        seqs = [list(prefix) + [EOS] for prefix in itertools.product(content, repeat=length - 1)]
        for seq, score in zip(seqs, sequence_scores(model, src, seqs).tolist()):
            scored.append((score / length ** alpha, seq))
    return sorted(scored, key=lambda h: -h[0])


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("max_len, alpha", [(3, 0.0), (3, 1.0), (4, 0.6), (4, 2.0)])
def test_a_wide_beam_finds_the_exhaustive_optimum(seed, max_len, alpha):
    vocab = 6  # pad, bos, eos, unk + 2 words: 3 content tokens
    model = tiny_model(seed, vocab=vocab, scale=2.0 + seed % 3)
    limits = DecodeLimits(BOS, EOS, PAD, max_len_a=0, max_len_b=max_len)
    src = random_sources(seed, [4, 2, 6], vocab)
    # Wide enough that every candidate of every step stays in the beam: at most 3^(L-1) live
    # prefixes, each proposing 3 content tokens and EOS.
    beam_size = 4 * 3 ** (max_len - 2)
    found = beam_search(model, src, limits, beam_size, length_penalty=alpha)
    for i, hyp in enumerate(found):
        one = unpadded(src, i)
        ranked = exhaustive_search(model, one, vocab, max_len, alpha)
        best_score, best = ranked[0]
        hyp_score = sequence_scores(model, one, [hyp]).item() / len(hyp) ** alpha
        assert hyp_score == pytest.approx(best_score, abs=1e-4), (hyp, best)
        if ranked[0][0] - ranked[1][0] > 1e-4:  # no near-tie: the very same sequence
            assert hyp == best
    # Sanity: distributions are not flat, so the optimum is not trivial.
    logp = sequence_scores(model, unpadded(src, 0), [[t, EOS] for t in (UNK, 4, 5)])
    assert logp.max() - logp.min() > 0.1


def reference_beam_search(model, src: torch.Tensor, max_len: int, K: int, alpha: float,
                          next_logp=None) -> list[int]:
    """Textbook beam search for one (1, S) source, no cache, no padding, no early stopping: keep
    the K best unfinished hypotheses by summed log-probability; an EOS among the K best candidates
    of a step finishes its hypothesis; at the length limit only EOS may follow; return the finished
    hypothesis with the best score / length^alpha. (Stopping early, as the library does, cannot
    change the answer: it only skips hypotheses that can no longer win.) The live hypotheses of a
    step are all t + 1 tokens long, so the model scores them in one forward, with no padding."""
    live: list[tuple[float, list[int]]] = [(0.0, [])]
    finished: list[tuple[float, list[int]]] = []
    for t in range(max_len):
        candidates = []
        if next_logp is None and live:
            tgt_in = torch.tensor([[BOS] + tokens for _, tokens in live])  # (live, t + 1)
            with torch.no_grad():
                logps = model(src.expand(len(live), -1), tgt_in).logits[:, -1].float().log_softmax(-1).tolist()
        for i, (score, tokens) in enumerate(live):
            logp = logps[i] if next_logp is None else next_logp(tokens)  # (V,); next_logp: a scripted model
            allowed = [EOS] if t + 1 == max_len else [v for v in range(len(logp)) if v not in (PAD, BOS)]
            candidates += [(score + logp[v], tokens + [v]) for v in allowed]
        candidates.sort(key=lambda c: -c[0])
        finished += [(s / (t + 1) ** alpha, toks) for s, toks in candidates[:K] if toks[-1] == EOS]
        live = [c for c in candidates if c[1][-1] != EOS][:K]
    return max(finished, key=lambda h: h[0])[1]


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("beam_size, alpha", [(2, 0.6), (3, 1.0), (4, 0.0), (2, -0.5), (3, -1.0), (4, -2.0)])
def test_beam_search_equals_a_textbook_beam_search(seed, beam_size, alpha):
    """Narrow beams over longer outputs, where the beam really prunes and stops early (its answer
    often differs from greedy search on these models)."""
    model = tiny_model(seed, vocab=9, scale=1.0 + seed % 3 / 2)
    max_len = 6
    limits = DecodeLimits(BOS, EOS, PAD, max_len_a=0, max_len_b=max_len)
    src = random_sources(seed, [4, 2, 6, 3, 5, 7], vocab=9)
    found = beam_search(model, src, limits, beam_size, length_penalty=alpha)
    for i, hyp in enumerate(found):
        one = unpadded(src, i)
        expected = reference_beam_search(model, one, max_len, beam_size, alpha)
        if hyp != expected:  # allowed only for a floating-point tie between the two
            scores = sequence_scores(model, one, [hyp]).item(), sequence_scores(model, one, [expected]).item()
            assert scores[0] / len(hyp) ** alpha == pytest.approx(scores[1] / len(expected) ** alpha,
                                                                  abs=1e-5), (hyp, expected)


class ScriptedModel(torch.nn.Module):
    """A stand-in for the encoder-decoder whose next-token distribution after each prefix is drawn
    at random (seeded by the prefix), far sharper than a tiny network's: some paths are nearly
    certain, which is where a wrong early-stopping bound shows. Decodes without a cache only."""

    def __init__(self, seed: int, vocab: int = 6, sharpness: float = 4.0, max_positions: int = 16):
        super().__init__()
        self.seed, self.vocab, self.sharpness = seed, vocab, sharpness
        self.cfg = Seq2SeqConfig(max_positions=max_positions)
        self.generator = torch.nn.Identity()

    def logits(self, prefix: tuple[int, ...]) -> torch.Tensor:
        g = torch.Generator().manual_seed(hash((self.seed, prefix)) % 2**62)
        return self.sharpness * torch.randn(self.vocab, generator=g)  # (V,)

    def next_logp(self, tokens: list[int]) -> list[float]:
        logp = self.logits((BOS, *tokens)).log_softmax(-1)
        logp[[PAD, BOS]] = float("-inf")
        return logp.tolist()

    def encode(self, src):
        return src.float()[..., None], torch.ones_like(src, dtype=torch.bool)[:, None, None], None

    def decode(self, ys, memory, src_mask, cache=None):
        assert cache is None
        return torch.stack([self.logits(tuple(row)) for row in ys.tolist()])[:, None], None, None


def completions(model: ScriptedModel, tokens: list[int], score: float, max_len: int):
    """Every (summed log-probability, length) that a live prefix can finish with, EOS included."""
    logp = model.next_logp(tokens)
    if len(tokens) + 1 == max_len:
        yield score + logp[EOS], max_len
        return
    for v, lp in enumerate(logp):
        if lp == float("-inf"):
            continue
        if v == EOS:
            yield score + lp, len(tokens) + 1
        else:
            yield from completions(model, tokens + [v], score + lp, max_len)


@pytest.mark.parametrize("alpha", [-2.0, -1.0, -0.5, 0.0, 0.6, 1.0, 2.0])
def test_the_early_stopping_bound_holds_against_exhaustive_search(alpha):
    """For every live prefix of scripted models, the best normalized score any completion reaches
    (found by enumerating them all) is at most what `best_reachable` promises, at negative length
    penalties too."""
    max_len = 5
    for seed in range(4):
        model = ScriptedModel(seed)
        prefixes = [[]] + [list(p) for n in range(1, max_len) for p in itertools.product((UNK, 4, 5), repeat=n)]
        for tokens in prefixes:
            score = 0.0
            for i, t in enumerate(tokens):
                score += model.next_logp(tokens[:i])[t]
            best = max(s / n ** alpha for s, n in completions(model, tokens, score, max_len))
            assert best <= best_reachable(score, len(tokens), max_len, alpha) + 1e-9, (tokens, alpha)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("beam_size, alpha", [(2, -1.0), (3, -0.5), (2, -2.0), (3, 0.6)])
def test_early_stopping_never_changes_the_answer_at_any_length_penalty(seed, beam_size, alpha):
    """Beam search on sharp scripted distributions equals the textbook beam search that never
    stops early, negative length penalties included (where short outputs are favoured)."""
    model = ScriptedModel(seed, sharpness=2.0 + seed % 4)
    max_len = 6
    limits = DecodeLimits(BOS, EOS, PAD, max_len_a=0, max_len_b=max_len)
    src = torch.tensor([[UNK, EOS]])
    found = beam_search(model, src, limits, beam_size, length_penalty=alpha, use_cache=False)[0]
    assert found == reference_beam_search(None, None, max_len, beam_size, alpha, model.next_logp)


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_len_a=-1.0), "DecodeLimits.max_len_a=-1.0 is invalid"),
    (dict(max_len_a=float("nan")), "DecodeLimits.max_len_a=nan is invalid"),
    (dict(max_len_b=-2), "DecodeLimits.max_len_b=-2 is invalid"),
    (dict(eos_id=None), "DecodeLimits.eos_id=None is invalid"),
])
def test_decode_limits_are_checked_on_construction(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        DecodeLimits(**{**dict(bos_id=BOS, eos_id=EOS, pad_id=PAD), **kwargs})


@pytest.mark.parametrize("kwargs, message", [
    (dict(beam_size=0), "beam_size=0 is invalid"), (dict(beam_size=2.0), "beam_size=2.0 is invalid"),
    (dict(length_penalty=float("inf")), "length_penalty=inf is invalid"),
])
def test_beam_search_checks_its_arguments_before_decoding(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        beam_search(tiny_model(0), random_sources(0, LENGTHS), LIMITS, **kwargs)


def test_a_stronger_length_penalty_never_picks_a_shorter_output():
    """Exact search (the beam holds every candidate) under score / length^alpha: raising alpha can
    only move the optimum to longer outputs, and on these models it does so at least once."""
    differs = False
    for seed in range(8):
        model = tiny_model(seed, vocab=6, scale=2.0 + seed % 3)
        limits = DecodeLimits(BOS, EOS, PAD, max_len_a=0, max_len_b=4)
        src = random_sources(seed, [4, 2, 6])
        short = beam_search(model, src, limits, 36, length_penalty=0.0)
        long = beam_search(model, src, limits, 36, length_penalty=2.0)
        differs |= short != long
        for a, b in zip(short, long):
            assert len(a) <= len(b)  # a stronger length penalty never favours shorter outputs
    assert differs


# --- evaluation mode ----------------------------------------------------------------------------

def test_decoding_is_deterministic_with_dropout_in_the_model():
    model = tiny_model(0, dropout=0.3).train()
    src = random_sources(0, LENGTHS)
    tgt = torch.tensor([[BOS, 4, 5, 3]] * len(LENGTHS))
    outputs = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        greedy = greedy_decode(model, src, LIMITS)
        beam = beam_search(model, src, LIMITS, beam_size=3)
        model.eval()
        with torch.no_grad():
            logits = model(src, tgt).logits
        outputs.append((greedy, beam, logits))
        model.train()
    (g0, b0, l0), (g1, b1, l1) = outputs
    assert torch.equal(g0, g1) and b0 == b1 and torch.equal(l0, l1)
    with torch.no_grad():  # in training mode dropout is live: the check above means something
        torch.manual_seed(0)
        a = model(src, tgt).logits
        torch.manual_seed(1)
        b = model(src, tgt).logits
    assert not torch.equal(a, b)


@pytest.mark.parametrize("training", [True, False])
def test_decoding_restores_the_models_training_flag(training):
    model = tiny_model(0, dropout=0.3).train(training)
    src = random_sources(0, LENGTHS)
    greedy_decode(model, src, LIMITS)
    assert model.training is training
    beam_search(model, src, LIMITS, beam_size=2)
    assert model.training is training
