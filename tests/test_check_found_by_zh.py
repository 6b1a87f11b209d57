"""The Chinese note on how a component was found sets the kind's name into the sentence with a space
before a Latin letter (认作 decoder-only 模型), as the Chinese docs write it."""

import re

from handformer.check.core.engine import FOUND_BY, found_note
from handformer.check.core.kinds import KINDS_BY_NAME


def test_a_kind_named_in_latin_letters_is_spaced_from_the_chinese_before_it():
    notes = [found_note(way, kind)["zh"] for way in FOUND_BY for kind in KINDS_BY_NAME]
    assert not [n for n in notes if re.search(r"[\u4e00-\u9fff][A-Za-z]", n)]
    assert "认作 decoder-only 模型" in found_note("structure", "gpt")["zh"]
