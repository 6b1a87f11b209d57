"""A block built from a namespace of settings (`Block(hp)`, hp a module-level SimpleNamespace) keeps the
file's own count of experts: check's "no experts" value is for a dict config alone (Raschka's
cfg["num_experts"] = 0). Built with none, its mixture held no experts and check's reading of it raised
(an internal error); with the file's four, a block of ungated experts is an honest NOT CHECKED."""

from __future__ import annotations

from pathlib import Path

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

FILE = Path(__file__).parent / "fixtures" / "learners_namespace_moe" / "top1_namespace.py"


def test_a_namespace_config_keeps_the_files_count_of_experts():
    result = check_file(str(FILE))
    statuses = {c.name: c.status for c in result.components}
    assert statuses == {"Top1MoE": "pass", "Block": "not_checked"}, format_report(result)
    block = next(c for c in result.components if c.name == "Block")
    assert block.error.kind != "internal" and "experts are not gated" in block.error.message, format_report(result)
