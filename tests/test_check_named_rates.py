"""Fields and arguments no table lists, read by what their names say (fixtures/learners_named_rates/):
a dropout's rate of any place (attention_dropout_prob, hidden_dropout_rate) as arguments of their own
and as config fields a part reads for itself, and a maximum length (max_context_length) are filled, so
the components are built and checked, not NOT CHECKED."""

from __future__ import annotations

from pathlib import Path

import pytest

from handformer.check.core.discovery import size_of
from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

HERE = Path(__file__).parent / "fixtures" / "learners_named_rates"


@pytest.fixture(scope="module")
def arguments():
    return check_file(str(HERE / "rates_as_arguments.py"), only=["mha", "ffn"])


@pytest.fixture(scope="module")
def config():
    return check_file(str(HERE / "rates_in_config.py"), only=["gpt"])


def test_rates_as_required_arguments_are_filled_and_checked(arguments):
    status = {c.name: c.status for c in arguments.components}
    assert status == {"ParallelSelfAttention": "pass", "ParallelMLP": "pass"}, format_report(arguments)


def test_a_config_answers_the_fields_its_parts_read(config):
    status = {c.name: c.status for c in config.components}
    assert status == {"TinyGPT": "pass"}, format_report(config)


@pytest.mark.parametrize("name, size", [
    ("attention_dropout_prob", "dropout"), ("activation_dropout", "dropout"), ("max_sequence_length", "max_len"),
    ("max_target_positions", "max_len"), ("max_new_tokens", None), ("max_batch_size", None)])
def test_names_of_common_words(name, size):
    assert size_of(name) == size
