"""The runner of beam search for the encoder-decoder: `beam_search(model, src, src_mask, max_len,
start_symbol, end_symbol, beam_size, alpha)` (the Annotated Transformer's greedy signature with a
beam size and a length penalty, and variants of the names).

The learner's search is handed the learner's own model when the file's encoder-decoder passes its
own check, through whatever methods it has, steered by hooks (runners/beam_own.py); else a tiny
handformer `Seq2SeqTransformer` wrapped with the Annotated Transformer's `encode(src, src_mask)`,
`decode(memory, src_mask, ys, tgt_mask)` and `generator(x)`; the report says which. The model is
steered: its log-probabilities are the network's (scaled down) plus a table of the next token's
probabilities by prefix, so that each scenario's right answer is known and the mistakes give other
answers:

- "long": a short hypothesis (A EOS) finishes first, a long one (B C D E EOS) has the best
  normalised score, and a finished hypothesis extended (A EOS F EOS) would score better still;
- "compounded": the short one is best, and dividing the running score by the length penalty
  at every step would make the long one win;
- "count_eos" and "count_bos": which of a short and a long hypothesis wins depends on whether the
  length counts EOS, and BOS;
- "first_finished": the first hypothesis to finish is not the best;
- "accumulated": ranking the candidates by the new token's log-probability alone, not the summed
  score, returns the other of two hypotheses of one length.

The learner's output is compared with handformer's beam search (`reference`, the same rules as
handformer.generation.decoding.beam_search: of the 2K best candidates an EOS among the K best
finishes its hypothesis and leaves the beam, the K best others are the live ones; done when K
have finished and no live one can beat the worst; the best normalised score wins) in the
length conventions tutorials use (the length counting EOS, not counting it, or counting BOS too,
reported as a convention). Named: EOS never ends a hypothesis, EOS left out of the output,
finished hypotheses extended, the shortest finished hypothesis returned instead of the best
normalised one, the length penalty compounded at every step, candidates ranked by their last
token's log-probability alone; beam size 1 without a length penalty
must be greedy decoding; a search that takes a batch must give each sentence what it gives that
sentence alone (the two sentences steered by different tables).

Shape legend: B batch (1), S source length, L hypothesis length, D d_model, V vocabulary.
"""

from __future__ import annotations

import ast
import itertools
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from handformer.check.core import fingerprint as fp
from handformer.check.core.argument_names import BEAM_NAMES as NAMES  # noqa: F401
from handformer.check.core.argument_names import named_each
from handformer.check.core.context import Context, finish, forward_parameters, guarded, names_of
from handformer.check.core.defaults import quietly
from handformer.check.core.discovery import Component, cannot_fill
from handformer.check.core.result import (
    DEPARTS,
    NOT_CHECKED,
    Check,
    ComponentResult,
    Finding,
    LearnerError,
    Text,
    text,
)
from handformer.check.core.source import first_line, locate, source_lines
from handformer.check.runners.beam_models import (  # noqa: F401
    BOS,
    EOS,
    PAD,
    SETTING_NAMES,
    HandformerModel,
    Steered,
    Table,
    call_search,
    hypotheses,
    hypothesis_tokens,
    settings_note,
)
from handformer.check.runners.model import source_ids, source_mask

TOK_A, TOK_B, TOK_C, TOK_D, TOK_E, TOK_F = 3, 4, 5, 6, 7, 8

MAX_LEN = 12  # tokens a hypothesis may hold, the start symbol included
SCENARIOS: dict[str, Table] = {
    # prefix (after BOS) -> next-token probabilities; the rest of the mass goes to a sink token,
    # whose continuations are EOS or the sink again, half and half
    "long": {(): {TOK_A: 0.5, TOK_B: 0.45}, (TOK_A,): {EOS: 0.6}, (TOK_B,): {TOK_C: 0.7},
             (TOK_B, TOK_C): {TOK_D: 0.7}, (TOK_B, TOK_C, TOK_D): {TOK_E: 0.7},
             (TOK_B, TOK_C, TOK_D, TOK_E): {EOS: 0.7}, (TOK_A, EOS): {TOK_F: 0.99},
             (TOK_A, EOS, TOK_F): {EOS: 0.99}},
    "compounded": {(): {TOK_A: 0.6, TOK_B: 0.3}, (TOK_A,): {EOS: 0.9}, (TOK_B,): {TOK_C: 0.9},
                   (TOK_B, TOK_C): {EOS: 0.9}},
    # A EOS against B C D EOS: counting EOS (or BOS too) the short one wins, not counting it the long
    "count_eos": {(): {TOK_A: 0.6, TOK_B: 0.3}, (TOK_A,): {EOS: 0.915}, (TOK_B,): {TOK_C: 0.906},
                  (TOK_B, TOK_C): {TOK_D: 0.906}, (TOK_B, TOK_C, TOK_D): {EOS: 0.906}},
    # counting BOS the short one wins, not counting it the long one
    "count_bos": {(): {TOK_A: 0.6, TOK_B: 0.35}, (TOK_A,): {EOS: 0.915}, (TOK_B,): {TOK_C: 0.9835},
                  (TOK_B, TOK_C): {TOK_D: 0.9835}, (TOK_B, TOK_C, TOK_D): {EOS: 0.9835}},
    # A EOS finishes first, B C EOS later with the better score under every length penalty (alpha 0
    # included): the first finished one is not the best
    "first_finished": {(): {TOK_A: 0.5, TOK_B: 0.45}, (TOK_A,): {EOS: 0.55}, (TOK_B,): {TOK_C: 0.95},
                       (TOK_B, TOK_C): {EOS: 0.95}},
    # A C EOS and B C EOS, of one length: B C EOS has the better sum, A C EOS the better last two
    # tokens, so only a search that ranks by the new token alone returns A C EOS
    "accumulated": {(): {TOK_A: 0.6, TOK_B: 0.35}, (TOK_A,): {TOK_C: 0.4, TOK_D: 0.35},
                    (TOK_B,): {TOK_C: 0.95}, (TOK_A, TOK_C): {EOS: 0.95}, (TOK_A, TOK_D): {EOS: 0.9},
                    (TOK_B, TOK_C): {EOS: 0.9}},
}
# "long" with A and B swapped: the second sentence of a batch (runners/beam.py: _batched)
MIRRORED: Table = {(): {TOK_B: 0.5, TOK_A: 0.45}, (TOK_B,): {EOS: 0.6}, (TOK_A,): {TOK_C: 0.7},
                   (TOK_A, TOK_C): {TOK_D: 0.7}, (TOK_A, TOK_C, TOK_D): {TOK_E: 0.7},
                   (TOK_A, TOK_C, TOK_D, TOK_E): {EOS: 0.7}, (TOK_B, EOS): {TOK_F: 0.99},
                   (TOK_B, EOS, TOK_F): {EOS: 0.99}}
LENGTHS = {"eos": ("the length counts the new tokens and EOS", "长度按新生成的 token 加 EOS 计"),
           "no_eos": ("the length counts the new tokens without EOS", "长度按新生成的 token 计，不含 EOS"),
           "bos": ("the length counts every token, BOS and EOS included",
                   "长度按所有 token 计，含 BOS 和 EOS")}
# the length penalty: score / length ** alpha, or GNMT's score / ((5 + length) / 6) ** alpha (Wu et al., 2016)
PENALTIES = {"": ("score / length^alpha", "得分 / 长度^alpha"),
             ":gnmt": ("score / ((5 + length) / 6)^alpha (GNMT's)",
                       "得分 / ((5 + 长度) / 6)^alpha（GNMT 的写法）")}
CONVENTIONS = {f"{n}{p}": (f"{pen}; {en}", f"{pen_zh}；{zh}") for p, (pen, pen_zh) in PENALTIES.items()
               for n, (en, zh) in LENGTHS.items()}
NOT_SUMMED = "beam_scores_not_accumulated"
# the scores not summed in Hugging Face's layout (":hf"): the K copies of the start, kept apart only by
# the -1e9 the sum would have carried, all live; the search stops by the best live score at the length
# reached (BeamHypotheses.is_done), not at the longest length (the rule of this reference)
FLAGS = ("beam_no_stop_at_eos", "beam_eos_not_emitted", "beam_finished_extended", "beam_shortest_returned",
         "beam_length_penalty_per_step", NOT_SUMMED, f"{NOT_SUMMED}:hf")


# --- handformer's beam search, with the named mistakes on request -------------------------------

def length(tokens: list[int], conv: str) -> int:
    """The length a hypothesis (BOS first) is normalised by."""
    n = len(tokens) - 1
    if conv.startswith("no_eos") and tokens[-1] == EOS:
        n -= 1
    if conv.startswith("bos"):
        n += 1
    return max(n, 1)


PENALTY_OF = {"": lambda n, alpha: n ** alpha, "gnmt": lambda n, alpha: ((5 + n) / 6) ** alpha}


def penalty(n: int, conv: str, alpha: float) -> float:
    """What the score of a hypothesis of length n is divided by, in the convention's penalty."""
    return PENALTY_OF[conv.partition(":")[2]](n, alpha)


def reference(model: Steered, memory: Tensor, K: int, steps: int, alpha: float, conv: str,
              flags: frozenset[str] = frozenset()) -> list[int]:
    """The best hypothesis (BOS first) of handformer's rules; `flags` plant the named mistakes. The
    search's convention, penalty and mistakes are tried on one model many times over: each search is
    run once a model (its log-probabilities are cached by prefix, so a search run again decodes
    nothing and answers the same) and kept with it, the memory it read held alive with it."""
    key = id(memory), K, steps, alpha, conv, flags
    if key not in model.searches:
        model.searches[key] = memory, _searched(model, memory, K, steps, alpha, conv, flags)
    return model.searches[key][1]


def _searched(model: Steered, memory: Tensor, K: int, steps: int, alpha: float, conv: str,
              flags: frozenset[str]) -> list[int]:
    def logp(tokens: list[int]) -> list[float]:
        return model.logprobs(memory, tokens[1:])

    def norm(score: float, tokens: list[int]) -> float:
        return score / penalty(length(tokens, conv), conv, alpha)

    hf = f"{NOT_SUMMED}:hf" in flags
    live: list[tuple[float, list[int]]] = [(0.0, [BOS])] * (K if hf else 1)
    finished: list[tuple[float, list[int]]] = []
    for step in range(1, steps + 1):
        model.prefetch(memory, [tokens[1:] for _, tokens in live])  # the live ones decoded as one batch
        candidates = _candidates(live, logp, step, alpha, flags)
        live = []
        for rank, (s, tokens) in enumerate(candidates[:2 * K]):
            ends = tokens[-1] == EOS and "beam_no_stop_at_eos" not in flags
            if ends and rank < K:  # among the K best: it finishes and leaves the beam
                finished.append((norm(s, tokens), tokens))
            if (not ends or "beam_finished_extended" in flags) and len(live) < K:
                live.append((s, tokens))
        best = sorted((f[0] for f in finished), reverse=True)[:K]
        reach = step if hf else steps  # the length the best live one may reach
        if not live or (len(best) == K and best[-1] >= max(s for s, _ in live) / penalty(reach, conv, alpha)):
            break
    if not finished:
        out = max(live, key=lambda c: norm(*c))[1]
    elif "beam_shortest_returned" in flags:
        out = finished[0][1]
    else:
        out = max(finished, key=lambda f: f[0])[1]
    if "beam_eos_not_emitted" in flags and out[-1] == EOS:
        out = out[:-1]
    return out


def _candidates(live: list[tuple[float, list[int]]], logp: Callable[[list[int]], list[float]], step: int,
                alpha: float, flags: frozenset[str]) -> list[tuple[float, list[int]]]:
    """Every live hypothesis extended by every token, best first: scored by the sum of its
    log-probabilities (by the new token's alone under beam_scores_not_accumulated; divided by
    step ** alpha under beam_length_penalty_per_step)."""
    unsummed = bool(flags & {NOT_SUMMED, f"{NOT_SUMMED}:hf"})
    divisor = step ** alpha if "beam_length_penalty_per_step" in flags else 1.0
    candidates = [((lp if unsummed else score + lp) / divisor, tokens + [token])
                  for score, tokens in live for token, lp in enumerate(logp(tokens))]
    return sorted(candidates, key=lambda c: -c[0])


def greedy(model: Steered, memory: Tensor, steps: int) -> list[int]:
    tokens = [BOS]
    for _ in range(steps):
        lp = model.logprobs(memory, tokens[1:])
        tokens.append(max(range(len(lp)), key=lambda v: lp[v]))
        if tokens[-1] == EOS:
            break
    return tokens


# --- the runner ------------------------------------------------------------------------------

@dataclass
class Call:
    """How the learner's beam search is called: its arguments by name."""

    comp: Component
    ctx: Context
    arg: dict[str, str | None]
    steps_from_max: int  # max_len counts BOS (1) or only the new tokens (0)

    def __call__(self, model: Steered, src: Tensor, K: int, alpha: float) -> list[int]:
        return hypothesis_tokens(self.ctx, self.comp, self.raw(model, src, K, alpha))

    def raw(self, model: Steered, src: Tensor, K: int, alpha: float) -> Any:
        """What the search returns, as it is (a batch of sentences)."""
        values = {"model": model.handed, "src": source_ids(model.handed, src),  # (B, S), or (S, B) as it took
                  "src_mask": source_mask(model.handed, src),
                  "max_len": MAX_LEN - 1 + self.steps_from_max, "start": BOS, "end": EOS, "beam": K,
                  "alpha": alpha}
        return call_search(self.ctx, self.comp, model, self.arg, values)


def _call(comp: Component, ctx: Context) -> Call:
    params = forward_parameters(comp.obj)
    names, required = names_of(params)
    arg = named_each(names, {**NAMES, **SETTING_NAMES})
    found = arg["model"] and arg["src"] and arg["beam"]
    cannot_fill(comp.name, required, arg.values(), found, "model / src / beam_size", (
        "beam search takes (model, src, src_mask, max_len, start_symbol, end_symbol, beam_size, alpha), the "
        "beam size as beam_size (beam_width, k, num_beams) and the length penalty as alpha (length_penalty)",
        "束搜索接受 (model, src, src_mask, max_len, start_symbol, end_symbol, beam_size, alpha)，束宽叫 "
        "beam_size（beam_width、k、num_beams），长度惩罚叫 alpha（length_penalty）"))
    steps_from_max = 0 if arg["max_len"] == "max_new_tokens" else 1
    return Call(comp, ctx, arg, steps_from_max)


def _finding(ctx: Context, comp: Component, name: str, observed: Text, form: str = "") -> Finding:
    number, code = locate(name, source_lines(ctx.objects(comp, "beam_search")))
    return Finding(name, observed, number, code, form)


def show(tokens: list[int]) -> str:
    return " ".join(map(str, tokens))


GROUPS_NOTE = text("it takes groups of beams (a diverse beam search): it was handed one group and no "
                   "diversity penalty, where it is the plain beam search; the penalty between groups was not "
                   "checked",
                   "它把束分成几组（多样化束搜索）：传入一组、多样性惩罚为 0，这时它就是普通的束搜索；"
                   "组与组之间的惩罚没有检查")


def check_beam_search(comp: Component, ctx: Context) -> ComponentResult:
    from handformer.check.runners import beam_lm

    res = ctx.result(comp)
    lm = beam_lm.decoder_only(comp, ctx)
    call, make = ((beam_lm.lm_call(comp, ctx, MAX_LEN - 1), beam_lm.lm_maker(res, ctx, comp)) if lm
                  else (_call(comp, ctx), _maker(res, ctx)))
    src = torch.tensor([[5, 7, 9, 11, 3, 6]])  # (1, S)
    steps = MAX_LEN - 1
    res.notes += [GROUPS_NOTE] * bool(call.arg.get("groups")) + settings_note(call.arg)
    alphas = [1.0] if call.arg["alpha"] else [0.0, 0.6, 0.7, 1.0]
    outcomes = _outcomes(call, make, src, alphas[0])
    if (length := _length_locked(outcomes, src)) is not None:
        return _fixed_length(res, comp, length, steps)
    conv, alpha, found = _search(outcomes, steps, alphas)
    ok = conv is not None and not found
    counted = conv or "eos"  # the convention the right answers are shown in: counting EOS where none matched
    for name, (model, memory, got) in outcomes.items():
        right = reference(model, memory, 2, steps, alpha, counted)
        same = _same(got, right)
        res.checks.append(Check(text(f"scenario {name!r} (beam 2, alpha {alpha:g}): the best hypothesis "
                                     f"equals handformer's beam search ({show(right)})",
                                     f"场景 {name!r}（束宽 2，alpha {alpha:g}）：最优假设与 handformer 的"
                                     f"束搜索一致（{show(right)}）"), same or ok,
                                text(f"yours: {show(got)}", f"你的：{show(got)}")))
    if conv is not None:
        en, zh = CONVENTIONS[conv]
        res.convention = text(en, zh)
        if not call.arg["alpha"]:
            res.notes.append(text(f"{comp.name} takes no length penalty: its search matches alpha = "
                                  f"{alpha:g}",
                                  f"{comp.name} 没有长度惩罚参数：它的搜索与 alpha = {alpha:g} 一致"))
    _beam_findings(res, ctx, comp, outcomes, found, steps, alpha, counted)
    guarded(res, lambda: _without_penalty(res, call, make, src, outcomes, steps, counted))
    _beyond_one_sentence(res, ctx, comp, call, make, src, steps)
    return finish(res)


Outcomes = dict[str, tuple[Steered, Tensor, list[int]]]  # scenario -> (its model, the memory, the answer)


def _outcomes(call: Call, make: Maker, src: Tensor, alpha: float) -> Outcomes:
    """Each scenario's steered model, its memory of `src`, and the search's answer there (beam 2)."""
    outcomes = {}
    for name, table in SCENARIOS.items():
        model = make(table)
        got = call(model, src, 2, alpha)
        outcomes[name] = (model, model.encode(src, (src != PAD).unsqueeze(-2)), got)
    return outcomes


def _length_locked(outcomes: Outcomes, src: Tensor) -> int | None:
    """The source's length, where every scenario's hypothesis is exactly that long and holds no EOS
    though the scenarios make EOS likeliest at different steps: a search whose output length its own
    code fixes (a couplet's second line as long as the first); else None."""
    n = int((src != PAD).sum())
    outputs = [_from_bos(got)[1:] for _, _, got in outcomes.values()]
    return n if all(len(o) == n and EOS not in o for o in outputs) else None


def _fixed_length(res: ComponentResult, comp: Component, length: int, steps: int) -> ComponentResult:
    """NOT CHECKED: a search whose output is as long as its source, never ended by EOS, is not
    compared with handformer's, which stops at EOS."""
    res.checks, res.findings, res.status = [], [], NOT_CHECKED
    res.error = LearnerError(
        "mapping", f"{comp.name} returns exactly as many tokens as the source holds ({length}) in every "
        f"scenario, never EOS, where {steps} were allowed: its output length is fixed by its own code (a "
        "length lock, no stop at EOS), so it is not compared with handformer's beam search, which stops at "
        "EOS; check has no reference for a search of fixed length (an adapter that lets it stop at EOS "
        "lets check grade it)", "",
        message_zh=f"{comp.name} 在每个场景里都正好返回和源序列一样多的 token（{length} 个），"
        f"从不返回 EOS，而允许的长度是 {steps}：它的输出长度由它自己的代码固定（锁定长度，不在 EOS 处停止），"
        "所以不和在 EOS 处停止的 handformer 束搜索比较；检查程序没有固定长度搜索的参考实现"
        "（写一个让它在 EOS 处停止的适配函数，检查程序就能判断）")
    return res


def _beyond_one_sentence(res: ComponentResult, ctx: Context, comp: Component, call: Call, make: Maker,
                         src: Tensor, steps: int) -> None:
    """Beam size 1, a batch of two sentences, and the cache the searches handed the model."""
    _beam_one(res, ctx, comp, call, make, src, steps)
    _batched(res, ctx, comp, call, make, steps)
    _cache_followed(res, ctx, comp, make)


# a line of the cache (past, kv, key, value) that reorders a tensor by rows: where a reorder left some out
CACHE_REORDER = (r"(?=.*(past|cache|kv|key|value|\bk\b|\bv\b))(index_select\(|[\w\])]\[\s*(torch\.tensor\()?"
                 r"\w*(rows|idx|index|indices|parent|order|beam)\w*\)?\s*[,\]])")


def _cache_followed(res: ComponentResult, ctx: Context, comp: Component, make: Maker) -> None:
    """Every tensor of the KV cache the search hands the learner's model (the keys and the values of
    every layer) follows the beams kept: each carries the token ids of its row (runners/beam_lm.py), so
    a tensor left in its old order shows other ids than the first tensor's."""
    if getattr(make, "axis", None) is None:  # no cache handed back: nothing to follow
        return
    parted = make.parted()
    shown, shown_zh = ", ".join(map(str, parted)), "、".join(map(str, parted))
    res.checks.append(Check(text("the KV cache handed to your model follows the beams kept in every tensor "
                                 "(the keys and the values of every layer)",
                                 "交给你的模型的 KV 缓存，每个张量（每一层的 key 和 value）"
                                 "都跟着保留下来的束"),
                            not parted, text(f"tensors {shown} follow other rows than tensor 0",
                                             f"张量 {shown_zh} 跟的行与张量 0 不同")))
    lines = source_lines(ctx.objects(comp, "beam_search"))
    at = first_line([CACHE_REORDER], [*getattr(lines, "near", []), *lines])
    res.findings += [Finding(DEPARTS, text(
        f"of the tensors your model hands back as its cache (counted from 0 in the order it returns them), "
        f"tensors {shown} were handed back to it in other rows than tensor 0: they were not reordered "
        "with it to the beams kept",
        f"你的模型作为缓存返回的张量里（按返回的顺序从 0 数），张量 {shown_zh} 再交给它时"
        "所在的行与张量 0 不同："
        "它们没有跟张量 0 一起按保留下来的束重排"), *at)] * bool(parted)


def _without_penalty(res: ComponentResult, call: Call, make: Maker, src: Tensor, outcomes: dict[str, Any],
                     steps: int, conv: str) -> None:
    """A search that takes a length penalty driven at alpha 0 too (the sum of log-probabilities
    decides): a penalty applied otherwise than score / length ** alpha shows there (score / length *
    alpha ranks the hypotheses as alpha 1 does at every alpha > 0); on a difference, the lines that read
    alpha are quoted (the one argument changed between the runs). The reference reads each scenario's
    first model (its log-probabilities already computed); the learner's search gets a fresh one."""
    name = call.arg["alpha"]
    if not name:
        return
    wrong = []
    for scenario, table in SCENARIOS.items():
        model, memory, _ = outcomes[scenario]
        if not _same(call(make(table), src, 2, 0.0), reference(model, memory, 2, steps, 0.0, conv)):
            wrong.append(scenario)
    res.checks.append(Check(text(f"with {name} = 0 (no length penalty: the sum of log-probabilities decides) "
                                 "the best hypothesis equals handformer's in every scenario",
                                 f"{name} = 0 时（没有长度惩罚：对数概率之和决定），每个场景的最优假设都与 "
                                 "handformer 的一致"), not wrong,
                            text(f"it differs in {', '.join(wrong)}", f"在 {', '.join(wrong)} 中不同")))
    if wrong:
        res.notes += _lines_reading(call.comp.obj, name)


def _lines_reading(fn: Any, name: str) -> list[Text]:
    """Where the learner's function reads the argument `name`: its first two lines that load it (none
    when it never reads it)."""
    lines = source_lines([fn])  # (number, text), in the order of the function's own lines
    tree = ast.parse(textwrap.dedent("\n".join(code for _, code in lines)))
    at = sorted({node.lineno for node in ast.walk(tree) if isinstance(node, ast.Name) and node.id == name})
    read = [lines[i - 1] for i in at[:2]]
    en = "; ".join(f"line {n}: {c.strip()}" for n, c in read)
    zh = "；".join(f"第 {n} 行：{c.strip()}" for n, c in read)
    return [text(f"{name} is applied at {en}", f"{name} 用在{zh}")] * bool(read)


OWN_DRIVEN = {None: ("no transformer, so it has no check of its own: its output layer is steered alone",
                     "它不是 Transformer，没有自己的检查：只引导它的输出层"),
              True: ("it passed its check", "它通过了检查"),
              False: ("it failed its check, but runs: the steering replaces its logits, so its mistakes do "
                      "not reach this check", "它没有通过检查，但能运行：引导替换了它的 logits，"
                      "所以它的错误不影响这项检查")}
Maker = Callable[..., Steered]  # (table, by_source=None) -> the steered model a search is handed


def _maker(res: ComponentResult, ctx: Context) -> Maker:
    """The learner's own model, steered by hooks, when it passes its check; else handformer's tiny
    model with the Annotated Transformer's interface; which one is said."""
    from handformer.check.runners.beam_own import own_name, own_steered

    own = own_steered(ctx)
    if own is not None:
        make, passed = own
        name = own_name(ctx, make({}).handed)
        en, zh = OWN_DRIVEN[passed]
        res.driven = text(f"your own {name} ({en}), through its own methods; its output layer steered by "
                          "each scenario's table of next-token probabilities",
                          f"你自己的 {name}（{zh}），用它自己的方法调用；它的输出层按每个场景的"
                          "下一个 token 概率表做了引导")
        return make
    res.driven = text("a stand-in: handformer's tiny Seq2SeqTransformer with the Annotated Transformer's "
                      "encode(src, src_mask), decode(memory, src_mask, ys, tgt_mask) and generator(x), "
                      "steered by each scenario's table; your own model has no passing check (or no "
                      "nn.Linear output layer to steer)",
                      "替身：handformer 的小 Seq2SeqTransformer，带 Annotated Transformer 的 "
                      "encode(src, src_mask)、decode(memory, src_mask, ys, tgt_mask)、generator(x)，"
                      "按每个场景的概率表做了引导；你自己的模型没有通过检查（或者没有可以引导的 nn.Linear "
                      "输出层）")
    base = HandformerModel()
    return lambda table, by_source=None: Steered(base, table, ctx, by_source)


def _beam_findings(res: ComponentResult, ctx: Context, comp: Component, outcomes: dict[str, Any],
                   found: frozenset[str], steps: int, alpha: float, conv: str) -> None:
    """Each mistake named, shown on the first scenario where the learner's answer is wrong."""
    for flag in sorted(found):
        model, memory, got = next(o for o in outcomes.values()
                                  if not _same(o[2], reference(o[0], o[1], 2, steps, alpha, conv)))
        right = reference(model, memory, 2, steps, alpha, conv)
        res.findings.append(_finding(ctx, comp, flag.partition(":")[0], text(
            f"your best hypothesis ({show(got)}) equals handformer's beam search with this mistake; the "
            f"right one is {show(right)}",
            f"你的最优假设（{show(got)}）与带这个错误的 handformer 束搜索一致；"
            f"正确的是 {show(right)}")))


def _from_bos(tokens: list[int]) -> list[int]:
    return tokens if tokens[:1] == [BOS] else [BOS] + tokens


def _same(got: list[int], right: list[int]) -> bool:
    """Equal, the start symbol left out allowed, padding after the end allowed."""
    got = _from_bos(got)
    while len(got) > len(right) and got[-1] == PAD:
        got = got[:-1]
    return got == right


def _search(outcomes: dict[str, tuple[Steered, Tensor, list[int]]], steps: int, alphas: list[float],
            ) -> tuple[str | None, float, frozenset[str]]:
    """The convention, length penalty and smallest set of mistakes (at most two) that give the
    learner's answer in every scenario."""
    for n in (0, 1, 2):
        for alpha in alphas:
            for conv in CONVENTIONS:
                for combo in _combos(n):
                    if all(_same(got, reference(model, memory, 2, steps, alpha, conv, combo))
                           for model, memory, got in outcomes.values()):
                        return conv, alpha, combo
    return _explains_each_difference(outcomes, steps, alphas) or (None, alphas[0], frozenset())


def _explains_each_difference(outcomes: dict[str, tuple[Steered, Tensor, list[int]]], steps: int,
                              alphas: list[float]) -> tuple[str, float, frozenset[str]] | None:
    """The convention, length penalty and one mistake that give the learner's answer in every scenario
    where it is not handformer's (and in one at least): a search that also stops otherwise (when K
    hypotheses have finished) answers right where its rule and handformer's agree."""
    for alpha, conv, combo in itertools.product(alphas, CONVENTIONS, _combos(1)):
        # each scenario's answer: 1 handformer's, 2 the mistake's, 3 both, 0 neither (the scenarios
        # after a 0 are not searched: one answer of neither rules the mistake out)
        answers = set()
        for model, memory, got in outcomes.values():
            answers.add(_same(got, reference(model, memory, 2, steps, alpha, conv))
                        + 2 * _same(got, reference(model, memory, 2, steps, alpha, conv, combo)))
            if 0 in answers:
                break
        if answers - {1, 3} == {2}:  # the mistake's answer in some, handformer's or the mistake's in all
            return conv, alpha, combo
    return None


def _combos(n: int) -> list[frozenset[str]]:
    """The sets of n mistakes, two forms of one mistake never together."""
    return [frozenset(c) for c in itertools.combinations(FLAGS, n)
            if len({flag.partition(":")[0] for flag in c}) == n]


def _batched(res: ComponentResult, ctx: Context, comp: Component, call: Call, make: Maker,
             steps: int) -> None:
    """A search that takes a batch gives each sentence what it gives that sentence alone: two
    sources, steered by the "long" table and its mirror (both run long, their beams part and swap,
    so a row that follows the other sentence's beams or cache reads the other table)."""
    srcs = torch.tensor([[5, 7, 9, 11, 3, 6], [4, 8, 10, 3, 5, 9]])  # (2, S)
    tables = {tuple(srcs[0].tolist()): SCENARIOS["long"], tuple(srcs[1].tolist()): MIRRORED}
    model = make(SCENARIOS["long"], tables)
    if not model.usable():
        res.notes.append(text("a batch of 2 sentences was not tried: check could not tell which sentence "
                              "each row your model decodes belongs to",
                              "没有试 2 句组成的 batch：检查程序分不清你的模型解码的每一行属于哪一句"))
        return
    raw = quietly(lambda: call.raw(model, srcs, 2, 1.0), fp.LearnerFailure)
    rows = _rows(raw, 2)
    if rows is None:
        res.notes.append(text(f"{comp.name} does not take a batch of 2 sentences (it raised, or returned "
                              "one hypothesis): it is checked one sentence at a time",
                              f"{comp.name} 不接受 2 句组成的 batch（报错，或只返回一个假设）："
                              "只按一次一句检查"))
        return
    # a language model's hypotheses are read after the prompt they repeat
    rows = [r[len(p):] if r[:len(p)] == p else r for r, p in zip(rows, srcs.tolist())]
    alone = []
    for i in range(2):
        single = make(SCENARIOS["long"], tables)
        alone.append(call(single, srcs[i:i + 1], 2, 1.0))
    same = all(_same(a, _from_bos(b)) for a, b in zip(rows, alone))
    shown, want = " | ".join(map(show, rows)), " | ".join(map(show, alone))
    res.checks.append(Check(text(f"a batch of 2 sentences gives what each gives alone ({want})",
                                 f"2 句组成的 batch 与每句单独搜索的结果相同（{want}）"), same,
                            text(f"batched: {shown}", f"批量：{shown}")))
    if not same:
        res.findings.append(_finding(ctx, comp, "beam_batched_differs", text(
            f"searched as a batch your hypotheses are {shown}; each sentence alone gives {want}",
            f"按 batch 搜索时你的假设是 {shown}；每句单独搜索得到 {want}")))


def _rows(raw: Any, n: int) -> list[list[int]] | None:
    """The n hypotheses of a batched search (a list of lists or tensors, or an (n, L) tensor)."""
    raw = hypotheses(raw)
    if isinstance(raw, Tensor) and raw.dim() == 2 and raw.size(0) == n:
        return [list(map(int, row.tolist())) for row in raw]
    if isinstance(raw, (list, tuple)) and len(raw) == n and all(
            isinstance(r, (list, tuple, Tensor)) for r in raw):
        out = []
        for r in raw:
            r = r.reshape(-1).tolist() if isinstance(r, Tensor) else list(r)
            if not all(isinstance(t, int) for t in r):
                return None
            out.append(list(map(int, r)))
        return out
    return None


def _beam_one(res: ComponentResult, ctx: Context, comp: Component, call: Call, make: Maker, src: Tensor,
              steps: int) -> None:
    """Beam size 1 without a length penalty is greedy decoding."""
    model = make(SCENARIOS["long"])
    got = call(model, src, 1, 0.0)
    memory = model.encode(src, None)
    right = greedy(model, memory, steps)
    ok = _same(got, right)
    res.checks.append(Check(text(f"beam size 1 without a length penalty equals greedy decoding "
                                 f"({show(right)})",
                                 f"束宽为 1、没有长度惩罚时等于贪心解码（{show(right)}）"), ok,
                            text(f"yours: {show(got)}", f"你的：{show(got)}")))
    if not ok and not res.findings:
        res.findings.append(_finding(ctx, comp, "beam_one_not_greedy", text(
            f"with beam_size=1 and alpha=0 your search gives {show(got)}; greedy decoding on the same model "
            f"gives {show(right)}", f"beam_size=1、alpha=0 时你的搜索得到 {show(got)}；"
            f"同一模型上的贪心解码得到 {show(right)}")))


