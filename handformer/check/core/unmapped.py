"""What the reference has no place for: a component that departs while it holds state or is handed
settings that check mapped to nothing (a settings object's Mirostat tau, an MoE's selection-only bias)
computes something the reference cannot express, so its difference is no evidence of a mistake: NOT
CHECKED, with the reason naming them, never FAIL. A catalogued mistake found in it still FAILs. Where
it matches, the report says what was left unchecked.
"""

from __future__ import annotations

import operator

from handformer.check.core.result import (
    FAIL,
    NOT_CHECKED,
    PASS,
    ComponentResult,
    Finding,
    LearnerError,
    Text,
    text,
)

NOWHERE = Finding("", text("", ""))  # a departure with no line


def settle(result: ComponentResult, unmapped: list[Text]) -> None:
    """A FAIL with nothing named, of a component that holds what the reference has no place for: NOT
    CHECKED, the line where it parts from the reference said in the reason; a PASS: said what was not
    checked."""
    if not unmapped:
        return
    en, zh = ("; ".join(map(operator.itemgetter(lang), unmapped)) for lang in ("en", "zh"))
    if result.status == PASS:
        result.notes.append(text(f"checked as it is built and given here; {en}: not checked at other values",
                                 f"按这里的构造和输入检查；{zh}：其他取值没有检查"))
    if (result.status, bool(result.named())) != (FAIL, False):  # a PASS, or a FAIL with a name: as it is
        return
    first = next(iter(result.findings), NOWHERE)
    shown = first.line is not None  # where it parts, as its departure quotes it
    result.status, result.findings = NOT_CHECKED, []
    result.checks = list(filter(operator.attrgetter("ok"), result.checks))
    result.error = LearnerError(
        "mapping", f"{result.name} computes something handformer's reference cannot express: {en}; it "
        f"parts from the reference{f' at line {first.line}: {first.code}' * shown}, which says nothing about "
        "whether it is right (an adapter that sets them to values the reference has, or leaves them out, "
        "lets check grade it)", "",
        message_zh=f"{result.name} 算的东西 handformer 的参考实现表达不了：{zh}；它与参考实现不同"
        f"{f'（第 {first.line} 行：{first.code}）' * shown}，这说明不了它对不对（写一个适配函数，"
        "把这些设置成参考实现有的取值，或者去掉它们，检查程序就能判断）")
