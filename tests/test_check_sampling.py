"""`handformer check` on the next chapter, from logits to tokens: the filters compared
deterministically, the sampling step by a chi-square test whose power against every named mistake
is computed, and generation loops of several shapes run on a wrapped handformer CausalLM."""

from __future__ import annotations

import pytest
import torch
from check_plants import correct_file, plant

from handformer.check.core import stats
from handformer.check.core.engine import check_file
from handformer.check.core.report import exit_code, format_report
from handformer.check.runners import generate_loop, sampling
from handformer.generation.generate import generate

pytestmark = pytest.mark.usefixtures("one_thread")
FIXTURES = correct_file("sampling").parent


def test_the_correct_file_passes():
    result = check_file(str(correct_file("sampling")))
    assert [(c.name, c.kind) for c in result.components] == [
        ("apply_temperature", "temperature"), ("top_k_filter", "top_k"), ("top_p_filter", "top_p"),
        ("min_p_filter", "min_p"), ("apply_repetition_penalty", "repetition_penalty"),
        ("greedy", "greedy"), ("sample_next_token", "sample"), ("generate", "generate"),
        ("generate_cached", "generate")]
    assert all(c.status == "pass" for c in result.components), format_report(result)
    assert exit_code(result) == 0


def test_hugging_faces_classic_filter_passes_its_equality_rule_a_noted_convention(tmp_path):
    """HF's classic top_k_top_p_filtering (cum > p, shifted right) keeps the token whose mass above
    equals p exactly: a convention, noted, never a failure; the real top-p mistakes still fail."""
    hf = check_file(str(FIXTURES / "hf_top_k_top_p_filtering.py"))
    (comp,) = hf.components
    assert comp.status == "pass" and exit_code(hf) == 0, format_report(hf)
    assert any("a convention" in n["en"] and "约定" in n["zh"] for n in comp.notes)
    mine = check_file(str(correct_file("sampling")), only=["top_p"]).components[0]
    assert not any("exactly" in n["en"] for n in mine.notes)
    for name in ("top_p_drops_crossing", "top_p_empty_set"):
        wrong = check_file(str(FIXTURES / f"{name}.py"), only=["top_p"])
        assert [f.name for c in wrong.components for f in c.findings] == [name] and exit_code(wrong) == 1
    # off by more than the equality case: the mass above compared with p + 0.1
    off = tmp_path / "off.py"
    off.write_text(correct_file("sampling").read_text().replace("mass_above >= p", "mass_above >= p + 0.1"))
    assert check_file(str(off), only=["top_p"]).components[0].status == "fail"


EOS_LOOP = """import torch


def generate(model, idx, max_new_tokens, eos_id=None):
    for _ in range(max_new_tokens):
        logits = model(idx[:, -model.config.block_size:])
        next_id = logits[:, -1, :].argmax(dim=-1, keepdim=True)
        idx = torch.cat((idx, next_id), dim=1)
        if eos_id is not None and (next_id == eos_id).all():
            break
    return idx
"""


def test_generate_is_offered_an_eos_and_must_stop_there(tmp_path):
    """A loop with an EOS parameter gets as EOS the token the model makes likeliest at a step: the
    loop that stops there passes, the one that runs on is named; a loop without one is not charged
    (the correct file's generate has none and passes, test_the_correct_file_passes)."""
    good = tmp_path / "eos.py"
    good.write_text(EOS_LOOP)
    (comp,) = check_file(str(good)).components
    assert comp.status == "pass" and any("eos_id=" in c.name["en"] for c in comp.checks), comp
    bad = tmp_path / "no_stop.py"
    bad.write_text(EOS_LOOP.replace("        if eos_id is not None and (next_id == eos_id).all():\n"
                                    "            break\n", ""))
    result = check_file(str(bad))
    (comp,) = result.components
    assert [f.name for f in comp.findings] == ["greedy_no_stop_at_eos"] and exit_code(result) == 1
    assert "went on to 4 new tokens" in comp.findings[0].observed["en"], format_report(result)
    raschka = tmp_path / "eos_left_out.py"  # breaks before appending EOS: a convention, noted
    raschka.write_text(EOS_LOOP.replace("        idx = torch.cat((idx, next_id), dim=1)\n", "").replace(
        "            break\n", "            break\n        idx = torch.cat((idx, next_id), dim=1)\n"))
    (comp,) = check_file(str(raschka)).components
    assert comp.status == "pass" and any("without appending EOS" in n["en"] for n in comp.notes), comp


def test_the_chi_square_test_rejects_at_one_in_a_million():
    for df in (1, 2, 3, 7):
        crit = stats.critical_value(df)
        assert abs(stats.survival(crit, df) - 1e-6) < 1e-9
    assert abs(stats.critical_value(7) - 40.52) < 0.05  # chi-square(7) table, alpha = 1e-6


def test_every_named_sampling_mistake_moves_the_distribution_far_past_what_the_test_can_miss():
    """For each setting of the sampling step and each mistake the runner names there, 20,000 draws
    from the mistake's distribution pass the chi-square test against the right one with a
    probability below 1e-12 (the noncentral chi-square's lower tail)."""
    class Everything:  # a sampling step with every option
        names = ["logits", "temperature", "top_k", "top_p"]

        def find(self, names):
            return next((n for n in self.names if n in names), None)

    settings = sampling._settings(Everything())
    assert [s[0]["en"] for s in settings] == ["plain", "temperature 0.5", "top_k 3", "top_p 0.8"]
    for label, _, right, mistakes in settings:
        for name, q in mistakes:
            miss = stats.miss_probability(right, q, sampling.DRAWS)
            assert miss < 1e-12, (label, name, miss)


def test_the_test_keeps_its_false_alarm_rate_on_handformers_own_sampler():
    """handformer's next_tokens, drawn as the runner draws, passes (p-values well above 1e-6)."""
    from handformer.generation.sampling import filter_logits, next_tokens

    row = sampling.SAMPLE_ROW
    for i, options in enumerate([{}, {"temperature": 0.5}, {"top_k": 3}, {"top_p": 0.8}]):
        g = torch.Generator().manual_seed(1000 + i)
        tokens = next_tokens(row.expand(sampling.DRAWS, -1).float(), generator=g, **options)
        probs = torch.softmax(filter_logits(row, **options), -1)
        test = stats.chi_square(torch.bincount(tokens, minlength=8).double(), probs)
        assert not test.rejected and test.p_value > 1e-3, (options, test)


def test_handformers_generate_is_the_reference_of_the_loop_checks():
    model = generate_loop.known_model()
    ours = generate_loop.greedy(model, generate_loop.prompts(2), generate_loop.LONG)[:, 3:]
    short = generate(model, generate_loop.prompts(2).tolist(), generate_loop.SHORT, temperature=0.0)
    assert torch.equal(ours[:, :generate_loop.SHORT], torch.tensor(short))
    assert all(len(set(row)) >= 4 for row in ours.tolist()), "the greedy tokens vary"


LOOPS = '''
import torch


def generate(model, prompt_ids, max_new_tokens):
    ids = list(prompt_ids)
    for _ in range(max_new_tokens):
        logits = model(torch.tensor([ids[-model.max_len:]]))
        ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt_ids):]


def greedy_generate(model, tokens, max_new_tokens, start_pos_fixed=False):
    # Meta's style: the model keeps the cache, positions are passed as start_pos
    logits = model(tokens, 0)
    out = []
    pos = tokens.size(1)
    for _ in range(max_new_tokens):
        next_id = logits[:, -1].argmax(-1, keepdim=True)
        out.append(next_id)
        logits = model(next_id, 0 if start_pos_fixed else pos)
        pos += 1
    return torch.cat(out, dim=1)
'''


def test_loops_of_other_shapes(tmp_path):
    """A list prompt for one row at a time, and Meta's start_pos with the cache kept by the model;
    start_pos left at 0 is named: positions not offset by the cache."""
    path = tmp_path / "loops.py"
    path.write_text(LOOPS)
    result = check_file(str(path))
    assert [c.status for c in result.components] == ["pass", "pass"], format_report(result)
    assert any("one prompt at a time" in n["en"] for n in result.components[0].notes)
    path.write_text(LOOPS.replace("start_pos_fixed=False", "start_pos_fixed=True"))
    (_, meta) = check_file(str(path)).components
    assert [(f.name, f.form) for f in meta.findings] == [("generate_cache_mismatch", "positions_not_offset")]


def test_top_p_with_neither_the_shift_nor_the_guard_names_both_mistakes(tmp_path):
    """remove = cumsum > p, no guard for the first token (the two plants rewrite the same rule, so
    this pair is written here): the crossing token dropped, and an empty set for p below the top
    probability."""
    source = plant(correct_file("sampling").read_text(), ["top_p_drops_crossing"]).replace(
        "    remove[..., 0] = False\n", "")
    path = tmp_path / "top_p.py"
    path.write_text(source)
    (comp,) = check_file(str(path), only=["top_p"]).components
    assert {f.name for f in comp.findings} == {"top_p_drops_crossing", "top_p_empty_set"}


def test_top_k_that_keeps_exactly_k_of_tied_tokens_is_a_convention(tmp_path):
    path = tmp_path / "top_k.py"
    path.write_text(correct_file("sampling").read_text().replace(
        'return logits.masked_fill(logits < kth, float("-inf"))',
        'keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, torch.topk(logits, k, dim=-1).indices, True)\n'
        '    return logits.masked_fill(~keep, float("-inf"))'))
    (comp,) = check_file(str(path), only=["top_k"]).components
    assert comp.status == "pass" and any("keeps exactly k" in n["en"] for n in comp.notes)




def test_top_p_at_one_fails_only_when_it_drops_probability_that_matters(tmp_path):
    """At p = 1 a filter may drop a token of probability 1e-26 (float rounding: the plant
    top_p_one_rounding passes), never 2^-7: cum >= p, with the guard and no early return, drops the
    dyadic row's least likely token."""
    source = correct_file("sampling").read_text().replace("    if p >= 1.0:\n        return logits\n", "")
    path = tmp_path / "top_p.py"
    path.write_text(source.replace("mass_above >= p", "torch.cumsum(probs, dim=-1) >= p"))
    (comp,) = check_file(str(path), only=["top_p"]).components
    p_one = next(c for c in comp.checks if c.name["en"].startswith("p = 1"))
    assert not p_one.ok and "0.0078" in p_one.detail["en"], p_one


FRACTION = FIXTURES.parent / "learners_fraction_sampling" / "fraction_filters_correct.py"


@pytest.mark.parametrize("old, new, name, line", [
    ("math.ceil((1.0 - thres) * n_vocab)", "math.ceil(thres * n_vocab)", "top_k_logits", 12),
    ("math.ceil(frac_num_tokens * logits", "math.ceil((1 - frac_num_tokens) * logits", "filter_top_k", 19),
    ("(h / tau - torch", "(h * tau - torch", "gumbel_draw", 27)])
def test_a_top_k_of_a_fraction_is_graded_by_the_fraction_its_default_says(tmp_path, old, new, name, line):
    """top_k(logits, thres=0.9) keeps ceil((1 - thres) * V) tokens (lucidrains'), top_k(logits,
    frac_num_tokens=0.1) keeps ceil(frac * V): asked for k as 1 - k/V or k/V, the correct file passes;
    the other fraction FAILs quoting the line that binds the count. A sampler of any first name that
    takes a temperature (gumbel_draw(h, tau)) is found by a call."""
    if old == "math.ceil((1.0 - thres) * n_vocab)":
        result = check_file(str(FRACTION))
        assert [(c.name, c.kind, c.status) for c in result.components] == [
            ("top_k_logits", "top_k", "pass"), ("filter_top_k", "top_k", "pass"),
            ("gumbel_draw", "sample", "pass")], format_report(result)
    wrong = tmp_path / "fraction.py"
    wrong.write_text(FRACTION.read_text().replace(old, new))
    result = check_file(str(wrong), only=["top_k", "sample"])
    comp = next(c for c in result.components if c.name == name)
    assert comp.status == "fail" and exit_code(result) == 1, format_report(result)
    assert [f.line for f in comp.findings] == [line], format_report(result)


def test_a_loops_temperature_is_read_from_the_probabilities_it_samples_from(tmp_path):
    """nanoGPT's generate driven once more at temperature 0.5 on its model's own logits: torch.multinomial
    records the probabilities it is handed (softmax(logits / 0.5)); the logits multiplied by the
    temperature instead are named at their line (a deterministic greedy run cannot tell them apart)."""
    source = (FIXTURES.parent / "learners_nanogpt" / "correct.py").read_text()
    planted = tmp_path / "nanogpt_temperature.py"
    planted.write_text(source.replace("logits[:, -1, :] / temperature", "logits[:, -1, :] * temperature"))
    (gen,) = check_file(str(planted), only=["generate"]).components
    assert gen.status == "fail" and [(f.name, f.line) for f in gen.findings] == [
        ("temperature_multiplied", 108)], format_report(check_file(str(planted), only=["generate"]))
    planted.write_text(source)
    (gen,) = check_file(str(planted), only=["generate"]).components
    assert gen.status == "pass" and any("temperature=0.5" in c.name["en"] and c.ok for c in gen.checks)


SETTINGS_SAMPLER = '''from dataclasses import dataclass

import torch


@dataclass
class DrawConfig:
    temperature: float = 0.7
    top_k: int = 20


def sample_next_token(logits, cfg: DrawConfig):
    """Logits (B, V) -> token ids (B,), llama.cpp's chain: top-k, then temperature."""
    if cfg.top_k > 0:
        kth = torch.topk(logits, min(cfg.top_k, logits.size(-1)), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    logits = logits / cfg.temperature
    return torch.multinomial(torch.softmax(logits, -1), 1).squeeze(-1)
'''


def test_a_sampler_that_takes_a_settings_dataclass_is_handed_one_with_its_options(tmp_path):
    """sample_next_token(logits, cfg: DrawConfig): the settings object is built with the option a draw
    sets and every other filter off; the temperature multiplied is named at its line."""
    path = tmp_path / "settings_sampler.py"
    path.write_text(SETTINGS_SAMPLER)
    (comp,) = check_file(str(path)).components
    assert comp.status == "pass", format_report(check_file(str(path)))
    path.write_text(SETTINGS_SAMPLER.replace("logits / cfg.temperature", "logits * cfg.temperature"))
    (comp,) = check_file(str(path)).components
    assert comp.status == "fail" and [(f.name, f.line) for f in comp.findings] == [
        ("temperature_multiplied", 17)], format_report(check_file(str(path)))


MIN_P_SAMPLE = """import torch
import torch.nn.functional as F


def sample_next_token(logits, temperature=1.0, min_p=0.0):
    probs = F.softmax(logits / temperature, dim=-1)
    probs = probs.masked_fill(probs < min_p, 0.0)
    return torch.multinomial(probs, 1)
"""


def test_a_sampling_step_whose_min_p_threshold_is_unscaled_is_named_at_its_line(tmp_path):
    """The draws with min_p = 0.1 fit the distribution of min_p_not_scaled (the threshold min_p
    itself), not handformer's: the step fails with that finding, quoted at the threshold's line."""
    path = tmp_path / "min_p_sample.py"
    path.write_text(MIN_P_SAMPLE)
    (comp,) = check_file(str(path), only=["sample"]).components
    assert comp.status == "fail"
    assert [(f.name, f.line) for f in comp.findings] == [("min_p_not_scaled", 7)], comp.findings


def test_a_private_sampler_named_as_the_table_is_found_and_its_plant_fails_at_its_line(tmp_path):
    """Meta's `_sample_top_p(probs, p)`, private to its completion loop: found by its name made
    private, and masking on the cumulative sum itself FAILs at that line."""
    from check_plants import edited_copy

    path = FIXTURES / "private_top_p.py"
    result = check_file(str(path))
    assert [(c.name, c.status) for c in result.components] == [("_sample_top_p", "pass")], format_report(result)
    planted = check_file(edited_copy(tmp_path, path, [("ranked[before > p] = 0.0",
                                                       "ranked[torch.cumsum(ranked, dim=-1) > p] = 0.0")]))
    (comp,) = planted.components
    assert [(f.name, f.code) for f in comp.findings] == [
        ("top_p_drops_crossing", "ranked[torch.cumsum(ranked, dim=-1) > p] = 0.0")], format_report(planted)
