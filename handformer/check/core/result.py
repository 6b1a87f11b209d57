"""What a check finds, as plain data (it crosses the process boundary as JSON): one
`ComponentResult` per component, with its findings (named diagnoses), property checks and notes.

Texts that the report shows are stored in both languages, {"en": ..., "zh": ...}.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from handformer.check.catalog.base import DEPARTS, UNLOCATED

Text = dict[str, str]  # {"en": ..., "zh": ...}

PASS, FAIL, DIFFERS, ERROR = "pass", "fail", "differs", "error"
TODO = "todo"  # the learner's code raises NotImplementedError: a starter file not filled in yet
# check could not build or drive the component (its constructor's arguments, its call, a stand-in's
# interface, a bug of handformer's): nothing is said about the learner's code; an adapter makes it checkable
NOT_CHECKED = "not_checked"
# a toy model with no block of its own (a few torch.nn layers, or no attention at all) that a file's training
# step or generation loop drives: no Transformer component to compare, its plain properties checked, noted
DRIVER = "driver"


def text(en: str, zh: str) -> Text:
    return {"en": en, "zh": zh}



@dataclass
class Finding:
    """A named diagnosis, with what was measured and where it probably is; or, named DEPARTS, the
    first line where the learner's computation parts from the reference."""

    name: str  # a key of handformer.check.reference.diagnoses.CATALOG, or DEPARTS
    observed: Text  # what was measured, with the number
    line: int | None = None  # line in the learner's file
    code: str | None = None  # that line's text
    form: str = ""  # the variant of the mistake, e.g. "-2" for the softmax dimension


@dataclass
class Check:
    """A property check: reference-free (causality, padding, ...) or against handformer."""

    name: Text
    ok: bool
    detail: Text | None = None


def failed_check(name: Text, ok: bool, detail: Callable[[], Text]) -> Check:
    """A check whose detail says what went wrong: written (`detail()`) only where it failed, the values
    it quotes there alone."""
    return Check(name, ok, None if ok else detail())


@dataclass
class LearnerError:
    """An exception (or a limit) in the learner's code, its traceback trimmed to their file."""

    kind: str  # exception | not_implemented | syntax | timeout | memory | nothing_found | discovery | mapping
    # | crash | internal | stand_in | cannot_build | cannot_call | own_step (a step the reference has not)
    message: str
    where: str = ""  # "import", "__init__", "forward", ...
    traceback: list[str] = field(default_factory=list)  # "line N: code" of the learner's frames
    message_zh: str = ""  # the message in Chinese ("" where the message is the learner's own exception)
    detail: str = ""  # check's own exception, for an internal error: in --json, and shown under --debug


@dataclass
class ComponentResult:
    kind: str
    name: str  # the learner's name for it
    status: str = PASS  # pass | fail | differs | error | todo | not_checked | driver
    max_abs_error: float | None = None
    mapping: list[str] = field(default_factory=list)  # "learner.param -> W_Q"
    convention: Text | None = None  # the mask convention detected
    findings: list[Finding] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    notes: list[Text] = field(default_factory=list)
    error: LearnerError | None = None
    driven: Text | None = None  # what model drove it: the learner's own, or a stand-in (and why)
    adapter: str = ""  # for NOT CHECKED: the adapter function that lets check build it

    def has(self, *names: str) -> bool:
        """Whether a finding of one of these names is already in the result."""
        return any(f.name in names for f in self.findings)

    def named(self) -> list[Finding]:
        """The catalogued mistakes found, without the line where the computation departs."""
        return [f for f in self.findings if f.name not in (DEPARTS, UNLOCATED)]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> ComponentResult:
        data = dict(data)
        data["findings"] = [Finding(**f) for f in data.get("findings", [])]
        data["checks"] = [Check(**c) for c in data.get("checks", [])]
        data["error"] = LearnerError(**data["error"]) if data.get("error") else None
        return ComponentResult(**data)


@dataclass
class FileResult:
    """The whole check of one file: per-component results, or an error before any component ran."""

    path: str
    components: list[ComponentResult] = field(default_factory=list)
    error: LearnerError | None = None  # syntax error, exception at import, nothing recognisable
    skipped: list[str] = field(default_factory=list)  # top-level statements not run (definitions graded)

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.components) and all(
            c.status in (PASS, DIFFERS, DRIVER) for c in self.components)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "ok": self.ok, "error": asdict(self.error) if self.error else None,
                "skipped": self.skipped, "components": [c.to_dict() for c in self.components]}
