"""The report of `handformer check`: readable text in English or Chinese, or JSON for an autograder.

Exit code: 0 when every component was checked and passes or differs by design (a consistently
pre-norm layer); 1 when any fails or raises (or the file cannot be imported, or defines nothing to
check); 3 when nothing failed but some component was NOT CHECKED (check could not build or drive
it: the report prints the adapter that lets it). 2 is the command line's usage error, a --component
naming what the file does not define included.
"""

from __future__ import annotations

import collections
import functools
import json
import locale
import os
import re

from handformer.check.core.adapters import CANNOT
from handformer.check.core.defaults import quietly
from handformer.check.core.discovery import DESCRIPTIONS
from handformer.check.core.kinds import KINDS_TABLE
from handformer.check.core.result import (
    DIFFERS,
    DRIVER,
    ERROR,
    FAIL,
    NOT_CHECKED,
    PASS,
    TODO,
    ComponentResult,
    FileResult,
    LearnerError,
)
from handformer.check.reference.diagnoses import diagnosis

STATUS = {"en": {PASS: "PASS", FAIL: "FAIL", DIFFERS: "DIFFERS", ERROR: "ERROR", TODO: "NOT IMPLEMENTED YET",
                 NOT_CHECKED: "NOT CHECKED", DRIVER: "A DRIVER, NOT GRADED"},
          "zh": {PASS: "通过", FAIL: "未通过", DIFFERS: "设计差异（允许）", ERROR: "出错", TODO: "尚未实现",
                 NOT_CHECKED: "未检查", DRIVER: "驱动用的模型，不评分"}}
KIND_ZH = {k.name: k.zh for k in KINDS_TABLE}
MASK_KINDS = ("causal_mask", "masked_softmax", "sdpa", "mha", "gqa", "causal_attention", "encoder_layer",
              "decoder_layer", "block")
WORDS = {
    "en": {":": ": ", "weights": "weights", "mask": "mask convention", "convention": "convention",
           "line": "line", "fix": "fix",
           "observed": "observed", "checks_ok": "passed ({n})", "failed": "failed check",
           "note": "note", "error": "error", "in": "in", "max": "max abs error",
           "summary": "{p} passed, {d} differ by design, {f} failed, {e} raised, of {n} components",
           "sandbox": "(your code ran in a child process: {t:g} s of CPU time and {m} MiB per step)",
           "memory": "ran out of memory", "nothing": "nothing to check",
           "todo": ", {n} not implemented yet (fill in their TODOs)",
           "not_checked": ", {n} not checked (check could not build or drive them: write the adapters shown)",
           "driver": ", {n} toy model(s) that only drive a loop, not graded",
           "why": "why not checked", "adapter": "the adapter that lets check build or drive it (in "
           "handformer_adapters.py beside your file, or --adapters FILE)", "driven": "driven through",
           "skipped": "top-level statements not run (your definitions were graded without them)",
           "sep": "; ", "paren": " ({})", "line_of": "line {n}: {code}"},
    "zh": {":": "：", "weights": "权重映射", "mask": "掩码约定", "convention": "约定", "line": "第",
           "fix": "修改建议", "observed": "观察到", "checks_ok": "满足的要求（{n}）",
           "failed": "未满足的要求",
           "note": "说明", "error": "错误", "in": "出在", "max": "最大绝对误差",
           "summary": "共 {n} 个组件：{p} 个通过，{d} 个属于设计差异（允许），{f} 个未通过，{e} 个出错",
           "sandbox": "（你的代码在子进程中运行：每一步限 {t:g} 秒 CPU 时间、内存 {m} MiB）",
           "memory": "内存不足", "nothing": "没有可检查的内容",
           "todo": "，{n} 个尚未实现（把其中的 TODO 写完）",
           "not_checked": "，{n} 个未检查（检查程序无法构建或调用它们：按提示写适配函数）",
           "driver": "，{n} 个只用来驱动循环的小模型，不评分",
           "why": "未检查的原因", "adapter": "写上这个适配函数，检查程序就能构建或调用它（放在你的文件旁边的 "
           "handformer_adapters.py 里，或者用 --adapters 文件）", "driven": "调用方式",
           "skipped": "没有运行的顶层语句（只检查了你的定义）", "sep": "；", "paren": "（{}）",
           "line_of": "第 {n} 行：{code}"},
}


LOCALE_VARIABLES = ("LC_ALL", "LC_MESSAGES", "LANG", "LANGUAGE")  # the first one set names the locale


def default_language() -> str:
    """zh when the locale is Chinese, else en."""
    value = next(filter(None, map(os.environ.get, LOCALE_VARIABLES)), "")
    if value:
        return _language(value)
    return _language(quietly(lambda: locale.getlocale()[0] or "", ValueError, ""))


def _language(code: str) -> str:
    return "zh" if code.lower().startswith("zh") else "en"


def exit_code(result: FileResult) -> int:
    """0 all checked and passed, 1 a failure (or the file could not be run at all), 2 a --component
    naming what the file does not define (a bad argument), 3 nothing failed but something was NOT CHECKED
    (or check recognised no component: nothing was checked, nothing failed)."""
    if result.ok:
        return 0
    if result.error is not None:
        return ERROR_EXITS.get(result.error.kind, 1)
    if result.components and all(c.status in (PASS, DIFFERS, NOT_CHECKED, DRIVER) for c in result.components):
        return 3
    return 1


ERROR_EXITS = {"discovery": 2, "nothing_found": 3}  # a file's error by its kind -> the exit code (else 1)


def to_json(result: FileResult) -> str:
    data = result.to_dict()
    data["exit_code"] = exit_code(result)
    for comp in data["components"]:
        for finding in comp["findings"]:
            d = diagnosis(finding["name"])
            finding["title"], finding["fix"] = d.title, d.fix
    return json.dumps(data, indent=2, ensure_ascii=False)


# handformer's side of a weight mapping ("name -> role") in Chinese; the learner's names stay as they are
ROLE_WORDS = {"token embedding": "词嵌入", "position embedding": "位置嵌入", "source embedding": "源端嵌入",
              "target embedding": "目标端嵌入", "learned positions": "可学习的位置编码",
              "source learned positions": "源端可学习的位置编码",
              "target learned positions": "目标端可学习的位置编码",
              "final norm": "最后的归一化层", "output head": "输出层", "output layer": "输出层",
              "block": "Block", "encoder": "编码器", "decoder": "解码器", "self-attention": "自注意力",
              "cross-attention": "交叉注意力", "FFN": "前馈网络"}
PLACE_WORDS = {"before": "之前", "after": "之后"}
NORM_PARTS_ZH = {": weight": "：权重", ": weight, bias": "：权重、偏置"}  # a norm's own parameters
ROLES_ZH = [(r" ?\(tied to the (token|target) embedding\)",
             lambda m: f"（与{ROLE_WORDS[m[1] + ' embedding']}共享权重）"),
            (r"(encoder|decoder) final norm", lambda m: f"{ROLE_WORDS[m[1]]}最后的归一化层"),
            (r"norm (\d+) \((before|after) ([^)]*)\)",  # Gemma 2/3's four: before and after each sublayer
             lambda m: f"归一化层 {m[1]}（{ROLE_WORDS.get(m[3], m[3])}{PLACE_WORDS[m[2]]}）"),
            (r"norm (\d+) \(([^)]*)\)", lambda m: f"归一化层 {m[1]}（{ROLE_WORDS.get(m[2], m[2])}）"),
            (r"(encoder|decoder) layer", lambda m: f"{ROLE_WORDS[m[1]]}层"),
            ("|".join(sorted(ROLE_WORDS, key=len, reverse=True)), lambda m: ROLE_WORDS[m[0]])]


def _mapping_zh(entry: str) -> str:
    """One row of a weight mapping in Chinese: handformer's role translated, the learner's name kept."""
    name, arrow, role = entry.partition(" -> ")
    if not arrow:  # a norm's own parameters: "name: weight, bias"
        return re.sub(r": weight(, bias)?$", lambda m: NORM_PARTS_ZH[m[0]], entry)
    for pattern, zh in ROLES_ZH:
        role = re.sub(pattern, zh, role)
    return f"{name} -> {role}"


# a top-level statement not run, as the engine writes it ("line N: code (why)"), in Chinese: the first
# form that matches (the learner's own exception keeps its text)
SKIPPED_ZH = ((r"line (\d+): (.*) \(the script's work, not a definition\)",
               "第 {} 行：{}（脚本要做的事，不是定义：没有运行）"),
              (r"line (\d+): (.*?) \((\w+: .*)\)", "第 {} 行：{}（运行出错，跳过了：{}）"),
              (r"line (\d+): (.*)", "第 {} 行：{}"))


# a traceback's frame in Chinese: "line 3, in forward: code" -> "第 3 行（forward 里）：code"
FRAME_ZH = ((r"line (\d+), in (\S+): (.*)", "第 {} 行（{} 里）：{}"), (r"line (\d+): (.*)", "第 {} 行：{}"))


def _skipped_zh(entry: str, forms: tuple[tuple[str, str], ...] = SKIPPED_ZH) -> str:
    """A top-level statement not run (or a traceback's frame) in Chinese, by the first of `forms` it
    matches; an entry of no such form as it is."""
    for pattern, zh in forms:
        found = re.fullmatch(pattern, entry, re.DOTALL)
        if found:
            return zh.format(*found.groups())
    return entry


def _paren(inner: str, lang: str) -> str:
    return WORDS[lang]["paren"].format(inner)


# the report's words for a kind, a weight mapping's row, a statement not run, by language
KIND_NAMES = {"en": DESCRIPTIONS, "zh": KIND_ZH}
IN_LANGUAGE = {"en": {"mapping": str, "skipped": str, "frame": str},
               "zh": {"mapping": _mapping_zh, "skipped": _skipped_zh,
                      "frame": functools.partial(_skipped_zh, forms=FRAME_ZH)}}


# a Chinese sentence before a message that has no Chinese of its own (the learner's own exception,
# "exception" from their Python, keeps its text: it is theirs)
LEAD_ZH = {"mapping": "检查程序没能把你的参数对应到 handformer 的参数上",
           "discovery": "没有找到要检查的组件",
           "stand_in": "检查程序的替身模型调用不了你的代码",
           "cannot_build": "检查程序构建不了这个组件", "cannot_call": "检查程序调用不了这个组件",
           "timeout": "超过了时间限制", "memory": "内存不足", "crash": "运行你的代码的子进程崩溃了",
           "syntax": "你的文件有语法错误", "internal": "检查程序驱动不了这个组件（这不说明你的代码有错）"}


# an English sentence around a message that is not the learner's: a stand-in's exception is never shown
# as theirs
# what to do next, under an error that stopped the whole file (its line is shown above the hint)
FILE_HINTS = {
    "en": {"syntax": "fix: Python cannot read the file; correct the line above (or the one before it), "
                     "then run check again",
           "nothing_found": "fix: point a kind at your name, e.g. --component mha=MyAttention (the kinds: "
                            "handformer check --help), or write an adapter (docs/check.md, "
                            "\"NOT CHECKED and adapters\")",
           "discovery": "fix: give --component a name the file defines, or leave the option out"},
    "zh": {"syntax": "修改：Python 读不了这个文件。先改好上面这一行（或它前面一行），再运行 check",
           "nothing_found": "修改：把某类组件指向你起的名字，例如 --component mha=MyAttention（类型列表见 "
                            "handformer check --help），或者写适配函数（见 docs/zh/check.md）",
           "discovery": "修改：--component 里写文件里定义了的名字，或者去掉这个选项"},
}

LEAD_EN = {"stand_in": "check's stand-in model would not take your code's call (the stand-in's own error, "
                       "not yours: {})"}


def _lead_zh(err: LearnerError) -> str:
    """A message written in English only, in Chinese: a sentence of its kind before it."""
    return f"{LEAD_ZH[err.kind]}（原文：{err.message}）" if err.kind in LEAD_ZH else err.message


def format_error(err: LearnerError, lang: str, indent: str = "  ", unchecked: bool = False,
                 debug: bool = False) -> list[str]:
    w = WORDS[lang]
    where = _paren(f"{w['in']} {err.where}", lang) if err.where else ""
    memory = err.kind == "memory" and "memory" not in err.message.split(":")[0]
    head = f"{w['memory']}{w[':']}" if memory else ""
    message = {"en": LEAD_EN.get(err.kind, "{}").format(err.message),
               "zh": err.message_zh or _lead_zh(err)}[lang]
    label = w["why"] if unchecked or err.kind in CANNOT else w["error"]
    lines = [f"{indent}{label}{where}{w[':']}{head}{message}"]
    lines += [f"{indent}  {IN_LANGUAGE[lang]['frame'](frame)}" for frame in err.traceback]
    lines += [f"{indent}  debug{w[':']}{err.detail}"] * (bool(err.detail) & debug)  # check's own error
    if not indent and err.kind in FILE_HINTS[lang]:
        lines.append(f"  {FILE_HINTS[lang][err.kind]}")
    return lines


def format_component(c: ComponentResult, lang: str, debug: bool = False) -> list[str]:
    w = WORDS[lang]
    kind = KIND_NAMES[lang].get(c.kind, c.kind)
    err = f"  {w['max']} {c.max_abs_error:.2g}" if c.max_abs_error is not None and c.status != ERROR else ""
    kind_shown = _paren(kind, lang) if kind != c.name else ""  # RMSNorm, not RMSNorm (RMSNorm)
    lines = [f"{c.name}{kind_shown}{w[':']}{STATUS[lang][c.status]}{err}"]
    if c.mapping:
        shown = [IN_LANGUAGE[lang]["mapping"](m) for m in c.mapping]
        lines.append(f"  {w['weights']}{w[':']}{', '.join(shown)}")
    if c.convention:
        label = w["mask"] if c.kind in MASK_KINDS else w["convention"]
        lines.append(f"  {label}{w[':']}{c.convention[lang]}")
    if c.driven:
        lines.append(f"  {w['driven']}{w[':']}{c.driven[lang]}")
    if c.error:
        lines += format_error(c.error, lang, unchecked=c.status == NOT_CHECKED, debug=debug)
    if c.adapter:
        lines.append(f"  {w['adapter']}{w[':']}")
        lines += [f"      {row}" for row in c.adapter.splitlines()]
    for f in c.findings:
        d = diagnosis(f.name)
        lines.append(f"  x {f.name}{w[':']}{d.title[lang]}")
        lines.append(f"      {w['observed']}{w[':']}{f.observed[lang]}")
        if f.line is not None:
            lines.append(f"      {w['line_of'].format(n=f.line, code=f.code)}")
        lines.append(f"      {w['fix']}{w[':']}{d.fix[lang]}")
    passed = [ch for ch in c.checks if ch.ok]
    for ch in c.checks:
        if not ch.ok:
            detail = _paren(ch.detail[lang], lang) if ch.detail else ""
            lines.append(f"  {w['failed']}{w[':']}{ch.name[lang]}{detail}")
    if passed:
        names = w["sep"].join(ch.name[lang] for ch in passed)
        lines.append(f"  {w['checks_ok'].format(n=len(passed))}{w[':']}{names}")
    for note in c.notes:
        lines.append(f"  {w['note']}{w[':']}{note[lang]}")
    return lines


def format_report(result: FileResult, lang: str = "en", time_limit: float | None = None,
                  memory_limit: int | None = None, debug: bool = False) -> str:
    """The text report; `debug` (--debug): check's own error under a component it could not drive."""
    w = WORDS[lang]
    out = [f"handformer check {result.path}"]
    if time_limit is not None:
        out.append(w["sandbox"].format(t=time_limit, m=memory_limit))
    if result.skipped:
        shown = [IN_LANGUAGE[lang]["skipped"](s) for s in result.skipped]
        out.append(f"{w['skipped']}{w[':']}" + w["sep"].join(shown))
    out.append("")
    if result.error:
        out += format_error(result.error, lang, indent="", debug=debug)
        return "\n".join(out) + "\n"
    for c in result.components:
        out += format_component(c, lang, debug) + [""]
    counts = collections.Counter(c.status for c in result.components)
    summary = w["summary"].format(p=counts[PASS], d=counts[DIFFERS], f=counts[FAIL], e=counts[ERROR],
                                  n=len(result.components))
    # the statuses the summary adds where any component has them: the words that say so, their count
    extra = (("todo", TODO), ("not_checked", NOT_CHECKED), ("driver", DRIVER))
    shown = [w[word].format(n=counts[status]) for word, status in extra if counts[status]]
    out.append(summary + "".join(shown))
    return "\n".join(out) + "\n"
