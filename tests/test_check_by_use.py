"""Arguments and configs filled by how the learner's code uses them (core/own_defaults.py): a
settings object a function reads by attribute (`settings.temperature`, `args.clip`) is a dataclass
of those fields at the values the file gives them (a dataclass's defaults, argparse's defaults); a
config namespace or dict answers a field check has no size for (BERT's type_vocab_size) with the
file's own value, and a config handed on whole answers its parts' subscripts. Each form: a correct
file that is checked and passes, and a planted one that fails on the planted line. A width argument
of a name of its own (query_dim, n_units) is the model's width where the constructor hands it to a
layer as its input width (core/size_roles.py), and keys and values in one projection beside the
queries' (lucidrains' to_kv) are read as [k | v] (core/weights.py). A
language model with a head of one number a position beside its output layer (PPO's value head) is
compared as the language model (core/layer_map.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from handformer.check.core.discovery import build
from handformer.check.core.engine import check_file
from handformer.check.core.own_defaults import own_defaults
from handformer.check.core.report import format_report
from handformer.check.core.sizes import SIZES

HERE = Path(__file__).parent / "fixtures" / "learners_by_use"
# file -> (the kind checked, the component's status, the planted line quoted or the mistake named: None
# for a correct file)
FILES = {
    "sampler_settings.py": ("sample", "pass", None),
    "sampler_settings_plant.py": ("sample", "fail", "logits = logits * settings.temperature"),
    "step_namespace.py": ("lm_train_step", "pass", None),
    "step_namespace_plant.py": ("lm_train_step", "fail", "loss.backward()"),
    "bert_dict.py": ("encoder_model", "pass", None),
    "bert_dict_plant.py": ("encoder_model", "fail", "attention_mask[:, None, None, :].to(scores.dtype) * -10000.0"),
    "width_query_dim.py": ("mha", "pass", None),
    "width_query_dim_plant.py": ("mha", "fail", "v, k = self.to_kv("),
    "width_units.py": ("mha", "pass", None),
    "width_units_plant.py": ("mha", "fail", "/ math.sqrt(C)"),
    "value_head.py": ("gpt", "pass", None),
    "value_head_plant.py": ("gpt", "fail", "x = self.wte(idx)"),
    "value_head_dict.py": ("gpt", "pass", None),
    "value_head_dict_plant.py": ("gpt", "fail", "final_norm_missing"),  # the norm's line is gone
}


@pytest.fixture(scope="module")
def results():
    out = {}
    for name, (kind, _, _) in FILES.items():
        result = check_file(str(HERE / name), only=[kind])
        out[name] = (next(c for c in result.components if c.kind == kind), format_report(result))
    return out


@pytest.mark.parametrize("name", list(FILES))
def test_an_argument_read_by_attribute_or_key_is_filled_from_the_files_values(results, name):
    comp, report = results[name]
    status, planted = FILES[name][1:]
    assert comp.status == status, report
    if planted:
        assert any(planted in str(f.code) or planted == f.name for f in comp.findings), report


def _imported(name: str):
    spec = importlib.util.spec_from_file_location(f"by_use_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name, cls", [("bert_namespace", "BertModel"), ("bert_dict", "BertModel"),
                                       ("bert_dict", "EncoderLayer")])
def test_a_config_answers_what_check_has_no_size_for_with_the_files_value(name, cls):
    """The namespace's attribute (argparse.Namespace(type_vocab_size=2)), the dict's key (dict(...)
    in a function), and a config handed on whole to parts that subscript it."""
    model = build(getattr(_imported(name), cls), dict(SIZES, src_vocab=29, n_layers=2))
    if cls == "BertModel":
        assert model.embeddings.token_type_embeddings.num_embeddings == 2


def test_the_files_values_are_read_declarations_first():
    values = own_defaults(_imported("step_namespace").train_step)
    assert (values["lr"], values["accum_steps"], values["clip"]) == (3e-4, 4, 0.5)  # argparse, dest=
    assert own_defaults(_imported("sampler_settings").sample_next_token)["order"] == "kt"  # a dataclass
