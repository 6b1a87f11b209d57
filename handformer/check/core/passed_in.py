"""Where a value a finding's line reads was passed in: a line that divides by `self.temperature`, set in
its class's constructor from an argument (`self.temperature = temperature`), computes what the call
that builds the class passes (`ScaledDotProductAttention(temperature=d_k)`): that call's line is quoted
after the finding's, the value may be wrong there."""

from __future__ import annotations

import ast
import linecache
import re

from handformer.check.core.result import ComponentResult
from handformer.check.core.source import parsed_file, with_second

ATTRIBUTE_READ = re.compile(r"\bself\.(\w+)\b(?!\s*\()")  # an attribute a line reads, not a method it calls


def passed_in(res: ComponentResult, filename: str) -> None:
    """Each named finding quoted on one line that reads an attribute its class's constructor sets from
    an argument, where a call of that class in the file chooses the argument (see `_call_passing`):
    the first such call's line after the finding's."""
    for finding in [f for f in res.named() if f.line]:
        read = ATTRIBUTE_READ.findall(str(finding.code).split("#")[0])
        found = next(filter(None, (_call_passing(str(filename), finding.line, a) for a in read)), (None, ""))
        finding.line, finding.code = with_second(finding.line, str(finding.code), *found)


def _call_passing(filename: str, line: int, attribute: str) -> tuple[int, str] | None:
    """(line, text) of the first call of the class around `line` that passes, by keyword, the argument
    its constructor sets `attribute` from (`self.attribute = argument`) a value chosen there: not the
    same name handed on (`temperature=temperature`), nor a setting read as it is (`eps=args.norm_eps`),
    nor a literal (`eps=1e-6`)."""
    cls = _class_around(parsed_file(filename), line)
    lines = [text.rstrip("\r\n") for text in linecache.getlines(filename)]
    body = "\n".join(lines[cls.lineno - 1:cls.end_lineno]) if cls else ""
    param = re.search(rf"^\s*self\.{attribute}\s*=\s*(\w+)\s*(#.*)?$", body, re.MULTILINE)
    # the argument by keyword, neither handed on under its own name, nor a setting read as it is
    # (`eps=args.norm_eps`), nor a literal
    chosen = rf"\b{param[1]}\s*=\s*(?!{param[1]}\b|\w+(\.\w+)+\s*[,)]|-?\s*[\d.]|[\"'])" if param else ""
    call = param and re.compile(rf"\b{cls.name}\(.*{chosen}")
    return next(((n, text.strip()) for n, text in enumerate(lines, 1) if call and call.search(text)), None)


def _class_around(tree: ast.Module, line: int) -> ast.ClassDef | None:
    """The innermost class whose definition holds the line."""
    around = [c for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and c.lineno <= line <= c.end_lineno]
    return max(around, key=lambda c: c.lineno, default=None)

