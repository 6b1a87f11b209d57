"""Point at the learner's code: the likely line of a diagnosis (from `inspect` on their classes and
functions), and exceptions with the traceback trimmed to their own file."""

from __future__ import annotations

import ast
import dis
import functools
import inspect
import itertools
import linecache
import math
import re
import sys
import textwrap
import traceback
import types
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from handformer.check.catalog.components import ADDED_AFTER, LINE_FORMS, PLAIN_ADD
from handformer.check.core.defaults import quietly
from handformer.check.core.result import LearnerError
from handformer.check.reference.diagnoses import CATALOG


class Objects(list):
    """A component's objects to look for a line in (Context.objects), the first `near` of them its
    own code and what it reads."""

    near: int = 0


class Lines(list):
    """(line number, text) of objects' sources, with `near`: those of the first objects alone (the
    component's own code and what it reads), where a mistake is looked for first."""

    near: list[tuple[int, str]] = []


def source_lines(objs: Iterable[Any]) -> Lines:
    """(line number, text) of each object's source, objects in order, duplicates once; `near` the
    lines of the first `objs.near` objects, where `objs` says how many are near (Context.objects)."""
    count, near = getattr(objs, "near", 0), []
    lines: dict[int, str] = {}
    for i, obj in enumerate(objs):
        near = list(lines.items()) if i == count else near
        for number, line in _lines_of(obj):
            lines.setdefault(number, line)
    out = Lines(lines.items())
    out.near = near
    return out


def _lines_of(obj: Any) -> tuple[tuple[int, str], ...]:
    """(line number, text) of one object's source; none when it has none. Remembered per object:
    `inspect` parses the whole file to find a class, and every diagnosis asks again."""
    try:
        return _remembered_lines(obj)
    except TypeError:  # an object that cannot be a key (unhashable)
        return _read_lines(obj)


@functools.lru_cache(maxsize=512)
def _remembered_lines(obj: Any) -> tuple[tuple[int, str], ...]:
    return _read_lines(obj)


def source_text(obj: Any) -> str:
    """The source of a class or function ("" when it has none), remembered as `source_lines` is."""
    return "".join(line + "\n" for _, line in _lines_of(obj))


def with_called_code(obj: Any) -> str:
    """obj's code and that of its file's functions it reads by name (a scheduler factory's LambdaLR of
    a factor written apart, `LambdaLR(optimizer, wsd_lambda(...))`; a DPO step's
    `concatenated_forward(model, batch)`)."""
    return "\n".join([source_text(obj), *map(source_text, functions_called(obj))])


def code_text(obj: Any) -> str:
    """The source of a class or function as `source_text` gives it, its comments and docstrings left
    out: what its code says (a comment that speaks of ALiBi handed in from outside adds no term)."""
    return "".join(line.split("#")[0] + "\n" for _, line in _code_lines(list(_lines_of(obj))))


def _read_lines(obj: Any) -> tuple[tuple[int, str], ...]:
    text, start = quietly(lambda: _class_lines(obj) if inspect.isclass(obj) else _function_lines(obj),
                          (OSError, TypeError), ([], 0))  # no lines where it has no source to read
    return tuple((start + i, line.rstrip()) for i, line in enumerate(text))


def _function_lines(fn: Any) -> tuple[list[str], int]:
    """`inspect.getsourcelines` of a function or method, its block found once for its file's text."""
    fn = inspect.unwrap(fn)
    if not isinstance(fn, (types.FunctionType, types.MethodType)):
        lines, start = inspect.getsourcelines(fn)
        return lines, max(start, 1)  # a module's whole file: numbered 0 by inspect, its first line is 1
    lines, start = inspect.findsource(fn)
    return list(_block(tuple(lines[start:]))), start + 1


@functools.lru_cache(maxsize=1024)
def _block(lines: tuple[str, ...]) -> tuple[str, ...]:
    """The definition that the file's lines from its first one on open: what `inspect.getblock` finds,
    remembered by that text (every check loads the learner's file again: new objects, same text; in a
    copy with one line edited, each definition below that line still opens the same text)."""
    return tuple(inspect.getblock(list(lines)))


def _class_lines(cls: type) -> tuple[list[str], int]:
    """`inspect.getsourcelines` of a class, its file parsed once (`inspect` parses the whole file again
    for each class it is asked about)."""
    module = inspect.getmodule(cls)
    lines = inspect.findsource(module)[0] if module else []
    start = _class_starts("".join(lines)).get(cls.__qualname__)
    if start is None:  # not a class its module's file defines (made by type(), or in a notebook)
        return inspect.getsourcelines(cls)
    return list(_block(tuple(lines[start:]))), start + 1


# what a definition adds to the qualified names of what it holds
SCOPES = {ast.ClassDef: ".", ast.FunctionDef: ".<locals>.", ast.AsyncFunctionDef: ".<locals>."}


@functools.lru_cache(maxsize=512)
def function_nodes(obj: Any) -> tuple[ast.AST, ...]:
    """The nodes of one function's (or class's) source, dedented and parsed once; none where it does
    not parse alone."""
    return quietly(lambda: tuple(ast.walk(ast.parse(textwrap.dedent(source_text(obj))))), SyntaxError, ())


def strided_loop(objs: Any) -> bool:
    """Whether the code of the first `objs.near` objects (a component's own and what it reads) loops
    in strides, `for start in range(0, N, block_size)`: a sequence walked in tiles or chunks."""
    near = list(objs)[:getattr(objs, "near", len(objs))]
    return any(_strided(node) for obj in near for node in function_nodes(obj))


def _strided(node: ast.AST) -> bool:
    """A `for` over range(start, stop, step) whose step is not the literal 1."""
    call = getattr(node, "iter", None) if isinstance(node, ast.For) else None
    if not (isinstance(call, ast.Call) and getattr(call.func, "id", "") == "range" and len(call.args) == 3):
        return False
    step = call.args[2]
    return not (isinstance(step, ast.Constant) and step.value in (1, -1))


@functools.lru_cache(maxsize=8)
def parsed_file(filename: str) -> ast.Module:
    """The learner's file parsed once (a file check imported: it parses); the trees are only read."""
    return ast.parse("".join(linecache.getlines(filename)))


@functools.lru_cache(maxsize=16)
def _class_starts(source: str) -> dict[str, int]:
    """The qualified name of each class of a file -> the index of its first line (its first
    decorator's), the first such class in the order of the file, as `inspect` finds it."""
    starts: dict[str, int] = {}
    _visit(ast.parse(source), "", starts)
    return starts


def _visit(node: ast.AST, prefix: str, starts: dict[str, int]) -> None:
    for child in ast.iter_child_nodes(node):
        suffix = SCOPES.get(type(child))
        if suffix is None:  # not a definition: what it holds keeps the prefix
            _visit(child, prefix, starts)
            continue
        name = prefix + child.name
        if isinstance(child, ast.ClassDef):
            starts.setdefault(name, (child.decorator_list or [child])[0].lineno - 1)
        _visit(child, name + suffix, starts)


def locate(name: str, lines: list[tuple[int, str]]) -> tuple[int | None, str | None]:
    """The line LINE_FINDERS finds for the diagnosis, else the first line matching its patterns,
    trying patterns in order; comments and docstrings are skipped. In the lines' `near` ones first
    (the component's own code and what it reads), then in all."""
    for tier in (getattr(lines, "near", []), lines):  # the component's own code first
        number, code = LINE_FINDERS.get(name, _nowhere)(tier)
        number, code = (number, code) if number is not None else first_line(CATALOG[name].patterns, tier,
                                                                            guards=True)
        if number is not None:
            return number, code
    return None, None


def _nowhere(lines: list[tuple[int, str]]) -> tuple[int | None, str | None]:
    return None, None


def _second_norm_call(lines: list[tuple[int, str]]) -> tuple[int | None, str | None]:
    """The line that calls one of the module's own norms (`self.norm_self_attn(`) a second time: where
    one norm serves a sublayer that has its own (labml's `z = self.norm_self_attn(x)` before the FFN,
    its norm_ff unused)."""
    called = set()
    for number, line in _code_lines(lines):
        for norm in NORM_CALL.findall(line.split("#")[0]):
            if norm in called:
                return number, _with_continuation(number, line, dict(lines))
            called.add(norm)
    return None, None


def _commented_out(pattern: re.Pattern[str], lines: list[tuple[int, str]]) -> tuple[int | None, str | None]:
    """The first line that is a statement the pattern finds, commented out: the line it was removed from
    (`# remove[..., 1:] = remove[..., :-1]`, top-p's shift, the token that crosses p then dropped;
    `# optimizer.zero_grad()`)."""
    return next(((n, line.strip()) for n, line in lines if pattern.match(line)), (None, None))


COMMENTED_ZERO_GRAD = re.compile(r"\s*#\s*[\w.]+\.zero_grad\(")


def _norm_never_read(lines: list[tuple[int, str]]) -> tuple[int | None, str | None]:
    """The line that binds a norm's output to a name no later line of the same function reads
    (`normed = self.norm(h)`, then `logits = self.lm_head(h)`): the norm computed, its result dropped."""
    for number, line in _code_lines(lines):
        bound = NORM_BOUND.match(line.split("#")[0])
        if bound and _nearest(lines, number, rf".*\b{bound[1]}\b", 1)[0] is None:
            return number, line.strip()
    return None, None


# a name bound to positions' embedding (`position_embeddings = self.position_embeddings(position_ids)`,
# `pos_emb = self.wpe(pos)`), not the positions themselves (`pos = torch.arange(T)`)
POSITION_BOUND = re.compile(r"(?i)\s*(\w*pos\w*)\s*=(?!=)(?![^#]*arange)[^#]*\(")
# a line that reads an embedding by a plain name (`inputs_embeds + token_type_embeddings`, nanoGPT's
# `self.transformer.drop(tok_emb)`), not one that looks one up (`self.token_type_embeddings(...)`)
EMBEDDINGS_READ = r"(?i)[^=#]*=[^#]*(?<![.\w])\w*emb\w*\b(?!\s*\()"


def _position_never_read(lines: list[tuple[int, str]]) -> tuple[int | None, str | None]:
    """Where the positions' embedding, bound to a name no later line of its function reads
    (`position_embeddings = ...`), should have been added: the next line of that function that reads
    an embedding by name (`embeddings = inputs_embeds + token_type_embeddings`, nanoGPT's `x =
    self.transformer.drop(tok_emb)`), else the binding line. None where every such name is read."""
    for number, line in _code_lines(lines):
        bound = POSITION_BOUND.match(line.split("#")[0])
        if bound and _nearest(lines, number, rf".*\b{bound[1]}\b", 1)[0] is None:
            reads, code = _nearest(lines, number, EMBEDDINGS_READ, 1)
            return (reads, code.strip()) if reads is not None else (number, line.strip())
    return None, None


def base_not_handed(lines: list[tuple[int, str]]) -> tuple[int | None, str | None]:
    """The first line that builds a rotary module or table into an attribute (`self.rotary_emb =
    RotaryEmbedding(self.head_dim, ...)`, `self.freqs_cis = precompute_freqs_cis(...)`) and hands it
    no base nor the whole config, its next line read too where its brackets stay open: where the base
    a config names is left out and the default used. None where none does."""
    for number, line in _code_lines(lines):
        after = dict(lines).get(number + 1, "") * (_depth(line) > 0)  # a statement that goes on
        if UNHANDED.match(line.split("#")[0] + after.split("#")[0]):
            return with_second(number, line.strip(), (number + 1) * bool(after), after)
    return None, None


def _concat_and_its_input(lines: list[tuple[int, str]]) -> tuple[int | None, str | None]:
    """The line that flattens the heads without a transpose (`x = x.contiguous().view(B, T, D)`) and,
    when the tensor it flattens was made on an earlier line of the same function (`x = weights @ v`),
    that line after it (a statement of several lines by its first): the transpose is missing from one of
    the two."""
    number, code = first_line(CATALOG["concat_no_transpose"].patterns, lines)
    reshaped = RESHAPED.search(str(code))
    return with_second(number, code, *_nearest(lines, number, rf"\s*{reshaped.group(1)}\s*=(?!=)", -1)) \
        if reshaped else (number, code)


def _cosine_without_floor(lines: list[tuple[int, str]]) -> tuple[int | None, str | None]:
    """The line that turns the cosine's factor into the rate without min_lr: the first line of the same
    function after `coeff = 0.5 * (1 + cos(...))` that reads the factor and names no minimum
    (nanoGPT's `return coeff * learning_rate`); else the cosine's own line (`lr = max_lr * 0.5 * (1 +
    cos(...))`)."""
    number, code = first_line([r"cos\("], lines)
    factor = re.match(r"\s*(\w+)\s*=(?!=)", dict(lines).get(number, ""))
    n, use = _nearest(lines, number, rf"(?i)(?!.*min).*\b{factor.group(1)}\b", 1) if factor else (None, "")
    return (n, _with_continuation(n, use, dict(lines))) if n else (number, code)


def _nearest(lines: list[tuple[int, str]], number: int, pattern: str, way: int) -> tuple[int | None, str]:
    """The nearest code line before `number` (way -1) or after it (way 1), in the same function, that
    the pattern matches (its comment left out), and its text; (None, "") where none does."""
    ordered = sorted(_code_lines(lines), key=lambda nl: way * nl[0])  # from the farthest before it
    ahead = itertools.dropwhile(lambda nl: way * (nl[0] - number) <= 0, ordered)
    block = itertools.takewhile(lambda nl: not HEADER.match(nl[1]), ahead)  # up to the function's own `def`
    return next(((n, line) for n, line in block if re.match(pattern, line.split("#")[0])), (None, ""))


def _projection_left_out(lines: list[tuple[int, str]]) -> tuple[int | None, str | None]:
    """Where the output projection belongs: a `return` of the merged heads (`return
    self.transpose_output(output)`, the diagnosis' first pattern), else the `return` after the first line
    that merges them (a `cat(`, a transpose, weights times values), in its function; when it returns a
    name (`return out`), the line that bound it last quoted after it (`out = self.dropout(out)`: the
    projection dropped from it)."""
    told = first_line(CATALOG["no_output_projection"].patterns[:1], lines)
    merged = first_line([HEADS_MERGED], lines)[0] if told[0] is None else math.inf
    n, ret = _nearest(lines, merged or math.inf, r"\s*return\b", 1)
    name = re.match(r"\s*return\s+(\w+)\s*(#.*)?$", ret)
    m, made = _nearest(lines, n, rf"\s*{name[1]}\s*=(?!=)", -1) if name else (None, "")
    quoted = (n, f"{ret.strip()} / line {m}: {made.split('#')[0].strip()}") if m else (n, ret.strip() or None)
    return told if told[0] is not None else quoted


def _both_norm_lines(lines: list[tuple[int, str]]) -> tuple[int | None, str | None]:
    """The first line that calls a norm and the next one in the same function that calls one: of a
    block whose placement is mixed, the two sublayers' lines, one pre-norm, the other post-norm."""
    number, code = first_line(CATALOG["pre_norm"].patterns, lines)
    if number is None:
        return None, None
    return with_second(number, code, *_nearest(lines, number, rf".*{CATALOG['pre_norm'].patterns[0]}", 1))


def _frequencies_and_their_factor(lines: list[tuple[int, str]]) -> tuple[int | None, str | None]:
    """The line that makes the encoding's frequencies (a `div_term =`, else a statement that takes an
    exp or a power, not a `def` whose default is 10000) and, when it reads a name an earlier line of
    the same function bound (Whisper's `log_timescale_increment`), that line after it: the exponent's
    factor may be wrong on either."""
    number, code = first_line(CATALOG["pe_wrong_frequency"].patterns, lines)
    if number is None:
        return None, None
    read = set(READ_NAMES.findall(code.split("=", 1)[-1]))
    bound = rf"\s*({'|'.join(map(re.escape, read))})\s*=(?!=)"  # a line that binds a name it reads
    return with_second(number, code, *_nearest(lines, number, bound, -1))


def _masks_passed_swapped(lines: list[tuple[int, str]]) -> tuple[int | None, str | None]:
    """The first call that passes the two masks in the order opposite to the one a `def` that takes
    both names them in (`layer(trg, enc_src, src_mask, trg_mask)` to `forward(self, dec, enc,
    trg_mask, src_mask)`): where one attention is handed the other's mask."""
    named = [(n, line.strip(), tuple(MASK_NAMES.findall(line.split("#")[0])), bool(HEADER.match(line)))
             for n, line in _code_lines(lines)]
    # a def's two masks, reversed, as a call (no def) would pass them swapped
    swapped = {(masks[::-1], False) for _, _, masks, header in named if header * (len(set(masks)) == 2)}
    return next(((n, line) for n, line, masks, header in named if (masks, header) in swapped), (None, None))


# a source's or a target's mask, by the names the tutorials give them
MASK_NAMES = re.compile(r"\b(\w*(?:src|tgt|trg|source|target)_?mask)\b")


def with_second(number: int, code: str, n: int | None, other: str) -> tuple[int, str]:
    """The line quoted with a second one after it (`n`, its text), where there is one and the first
    is not a statement of two lines already: a FAIL quotes two of the learner's lines at most."""
    joined = f"{code} / line {n}: {other.split('#')[0].strip()}"
    return (number, joined) if n and " / line " not in code else (number, code)


READ_NAMES = re.compile(r"(?<![.\w])([A-Za-z_]\w*)\b(?!\s*\()")  # the names a line reads, not calls

# what merges attention heads: a concatenation, a transpose back, weights times values (`wei @ v`, not
# a decorator's @)
HEADS_MERGED = r"\bcat\(|transpose\(|permute\(|einsum\(|\w\s*@\s*\w|matmul\(|scaled_dot_product_attention\("
# the name a line flattens (`x.contiguous().view(`), on a line quoted alone
RESHAPED = re.compile(r"^(?!.* / line ).*?\b(\w+)(?:\.contiguous\(\))?\.(?:view|reshape)\(")
NORM_CALL = re.compile(r"(?i)self\.(\w*(?:norm|ln)\w*)\(")
# a line that builds a rotary module or table into an attribute and hands it no base (`base=`,
# `theta`), nor the whole config (`Rotary(config)`)
UNHANDED = re.compile(r"(?i)\s*self\.\w+\s*=\s*[\w.]*(rotary|rope|freqs)\w*\("
                      r"(?!.*(base|theta|\bconfig\s*[,)]))")
# a line that binds one name to a norm's output: `normed = self.final_layernorm(h)`, `x = self.ln_f(x)`
NORM_BOUND = re.compile(r"(?i)\s*([A-Za-z_]\w*)\s*=\s*self\.[\w.]*(?:norm|ln)\w*\(")
COMMENTED_SHIFT = re.compile(r"\s*#\s*[\w.]+\[\s*\.\.\.\s*,\s*1\s*:\s*\]\s*=\s*"
                             r"[\w.]+\[\s*\.\.\.\s*,\s*:\s*-1\s*\]")
# a flattened (batch * beams) row index: a parent's row assigned with no batch offset, in a search that
# writes the offset (batch_idx * num_beams, torch.arange(B) * K) on another line
BEAM_ROW = re.compile(r"^\s*(\w*beam\w*(id|idx|ind)|\w*parent)\w*(\s*,\s*\w+)*\s*=(?!=)"
                      r"(?![^#]*(\*|batch|offset))")
BATCH_OFFSET = re.compile(r"\b(\w*(batch|arange)\w*|b)\b[^#=]*\*\s*\w*(beam|\bk\b)", re.IGNORECASE)


def _beam_row_without_offset(lines: list[tuple[int, str]]) -> tuple[int | None, str | None]:
    """The line that picks a parent beam's row of a flattened batch without the batch offset, where
    another line of the search writes that offset."""
    code = _code_lines(lines)
    found = next(filter(lambda line: BEAM_ROW.match(line[1]), code), (None, None))
    return found if BATCH_OFFSET.search("\n".join(dict(code).values())) else (None, None)


# diagnoses whose line is found by more than a pattern of one line
LINE_FINDERS = {"beam_batched_differs": _beam_row_without_offset,
                "shared_norm": _second_norm_call, "rope_wrong_base": base_not_handed,
                "top_p_drops_crossing": functools.partial(_commented_out, COMMENTED_SHIFT),
                "final_norm_missing": _norm_never_read,
                "concat_no_transpose": _concat_and_its_input,
                "no_output_projection": _projection_left_out, "cosine_min_lr_ignored": _cosine_without_floor,
                "pe_wrong_frequency": _frequencies_and_their_factor, "pre_norm": _both_norm_lines,
                "decoder_masks_swapped": _masks_passed_swapped,
                "train_step_no_zero_grad": functools.partial(_commented_out, COMMENTED_ZERO_GRAD),
                "pe_missing": _position_never_read}


def first_pattern_matches(name: str, code: str, form: str = "") -> bool:
    """Whether the diagnosis' first (its most telling) pattern finds the line, or the pattern of the
    form it was found in (LINE_FORMS); the later ones are guesses (`norm`, `embed|emb`)."""
    told = (CATALOG[name].patterns[0], *LINE_FORMS.get((name, form), {}).values(),
            *[PLAIN_ADD] * ((name, form) in ADDED_AFTER))
    return any(re.search(pattern, code.split("#")[0]) for pattern in told)


def pattern_rank(name: str, code: str) -> float:
    """The place in the diagnosis' list of the first of its patterns that finds the line (0: its most
    telling); math.inf where none does."""
    code = code.split("#")[0]
    return next((i for i, p in enumerate(CATALOG[name].patterns) if re.search(p, code)), math.inf)


def lines_matching(name: str, lines: list[tuple[int, str]]) -> list[int]:
    """The numbers of the code lines any of the diagnosis' patterns matches."""
    regexes = list(map(re.compile, CATALOG[name].patterns))
    return [n for n, t in _code_lines(lines) if any(r.search(t.split("#")[0]) for r in regexes)]


def _code_lines(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The lines that are code: comments and docstrings skipped, each from its opening triple quote
    (r\"\"\" too) through its closing one."""
    code, inside = [], False
    for number, line in lines:
        stripped = line.strip()
        if not (inside or not stripped or stripped.startswith("#") or STRING_OPENS.match(stripped)):
            code.append((number, line))
        inside ^= (stripped.count('"' * 3) + stripped.count("'" * 3)) % 2 == 1
    return code


HEADER = re.compile(r"\s*(async\s+)?(def|class)\s")
STRING_OPENS = re.compile(r"[rRbBuU]{0,2}(\"{3}|'{3})")


def first_line(patterns: Iterable[str], lines: list[tuple[int, str]], guards: bool = False,
               ) -> tuple[int | None, str | None]:
    """The first code line the patterns find, trying them in order (comments and docstrings
    skipped), and its text; with `guards` (a diagnosis' patterns), a guard a guess found gives the
    line it guards (see `_guarded`)."""
    code_lines = _code_lines(lines)  # a `def` or `class` line last: a name there is rarely the mistake
    in_order = sorted(code_lines, key=lambda nl: bool(HEADER.match(nl[1])))
    for rank, pattern in enumerate(patterns):
        regex = re.compile(pattern)
        for number, line in in_order:
            if regex.search(line.split("#")[0]):
                number, line = _guarded(number, line, code_lines) if rank and guards else (number, line)
                return number, _with_continuation(number, line, dict(lines))
    return None, None


def _guarded(number: int, line: str, code_lines: list[tuple[int, str]]) -> tuple[int, str]:
    """A guess (a pattern after the first) that found a guard, a test of whether a setting is given
    (Meta's `if temperature > 0:`, `if mask is not None:`): the guard computes nothing, the first
    statement it guards computes what the setting changes, and is the line quoted; any other line as
    found."""
    if not GUARD.match(line):
        return number, line
    indent = len(line) - len(line.lstrip())
    body = [(n, t) for n, t in code_lines if n > number]
    first = next(iter(body), (number, line))
    return first if len(first[1]) - len(first[1].lstrip()) > indent else (number, line)


# a test of a setting's presence: `if temperature > 0:`, `elif top_k is not None:`, `if self.training:`
GUARD = re.compile(r"\s*(el)?if\s+(not\s+)?[\w.]+(\s*(is\s+not|is|>|!=)\s*(None|0|0\.0|False))?"
                   r"\s*:\s*(#.*)?$")


def _with_continuation(number: int, line: str, lines: dict[int, str]) -> str:
    """The line, and the next one when the statement goes on there and ends on it (a bracket left
    open, `scores + torch.triu(`): a statement of two lines is quoted whole, a longer one by its first."""
    after = lines.get(number + 1, "")
    depth = _depth(line)
    return (line.strip(), f"{line.strip()} / line {number + 1}: {after.strip()}")[0 < depth == -_depth(after)]


def _depth(line: str) -> int:
    """The brackets a line leaves open (negative: closes), its comment left out."""
    code = line.split("#")[0]
    return sum(map(code.count, "([{")) - sum(map(code.count, ")]}"))


def locate_form(name: str, form: str, lines: list[tuple[int, str]]) -> tuple[str, int | None, str | None]:
    """A diagnosis' form and likely line: where check's sizes make two forms give one output (a
    divisor d_k = 4 = sqrt(d_model = 16)), the form the learner's line writes (LINE_FORMS), at that
    line; else the form found, at `locate`'s line."""
    for shown, pattern in LINE_FORMS.get((name, form), {}).items():
        number, code = first_line([pattern], [*getattr(lines, "near", []), *lines])  # its own code first
        if number is not None:
            return (shown, *QUOTED_AT.get((name, form), _as_found)(number, code, lines))
    return (form, *locate(name, lines))


def _added_after(number: int, code: str, lines: list[tuple[int, str]]) -> tuple[int, str]:
    """The line that adds what line `number` assigns to the stream: that line where it adds it itself
    (`x = x + self.mlp(...)`), else the next plain add of its name within two code lines (`hidden_states
    = residual + hidden_states` after `hidden_states = self.mlp(...)`), else that line still."""
    name = re.match(r"\s*(\w+)\s*=(?![^#]*\+)", code)  # None: the line adds it itself
    later = [(n, t) for n, t in _code_lines(sorted(set(lines))) if n > number][:2]
    adds = [(n, t) for n, t in later if name and re.search(PLAIN_ADD, t.split("#")[0])
            and re.search(rf"\b{name[1]}\b", t.split("=", 1)[1])] + [(number, dict(lines).get(number, code))]
    return adds[0][0], _with_continuation(*adds[0], dict(lines))


def _as_found(number: int, code: str, lines: list[tuple[int, str]]) -> tuple[int, str]:
    return number, code


QUOTED_AT = dict.fromkeys(ADDED_AFTER, _added_after)  # (name, form) -> the line quoted of the line found


def learner_error(err: BaseException, path: str, where: str) -> LearnerError:
    """The exception as a report: message, and the innermost two frames that are in the learner's
    file (where it raised, and the line that called that)."""
    if isinstance(err, SyntaxError) and err.filename and _same(err.filename, path):
        frames = [f"line {err.lineno}: {(err.text or '').strip()}"]
        return LearnerError("syntax", f"SyntaxError: {err.msg}", where, frames,
                            f"语法错误（SyntaxError）：{err.msg}")
    stack = traceback.extract_tb(err.__traceback__)
    frames = [f"line {f.lineno}, in {f.name}: {(f.line or '').strip()}"
              for f in stack if _same(f.filename, path)][-2:]  # a FAIL quotes two of their lines at most
    stand_in = raised_by_stand_in(stack, path) or refused_by_stand_in(err)
    kind = "memory" if _is_memory(err) else "stand_in" if stand_in else "exception"
    message = f"{type(err).__name__}: {err}".strip()
    if isinstance(err, NotImplementedError) and raised_by_learner(stack, path):  # a starter's TODO, not a bug
        kind, message = "not_implemented", f"not implemented yet ({message.rstrip(':')})"
    if isinstance(err, SystemExit):
        message = (f"SystemExit: your code called sys.exit({err.code!r}) (or raised SystemExit); a component "
                   "returns its result, it does not end the program")
    return LearnerError(kind, message.splitlines()[0][:400], where, frames)  # (never empty: its type's name)


def raised_by_learner(stack: traceback.StackSummary, path: str) -> bool:
    """Whether the learner's own file raised it (their `raise NotImplementedError` of a TODO), not
    torch (a kernel "not implemented for 'Long'": arguments of the wrong dtype) nor a function check
    patched in (core/precision.py's softmax) that passed torch's exception on."""
    return bool(stack) and _same(stack[-1].filename, path)


def raised_by_stand_in(stack: traceback.StackSummary, path: str) -> bool:
    """Whether the innermost frame that is neither torch's nor Python's own is handformer's: the
    learner's code called a stand-in (a model check built for it) that would not take the call, so
    the exception is the stand-in's, never shown as theirs. The mode that reads "cuda" as the CPU
    (core/cpu_only.py), the float64 softmax (core/precision.py) and the bounded top-k (core/whole_topk.py)
    wrap torch's own calls: not a stand-in."""
    import os

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    patched = {os.path.join(os.path.dirname(os.path.abspath(__file__)), name)  # torch's calls, wrapped
               for name in ("cpu_only.py", "precision.py", "whole_topk.py")}
    for frame in reversed(stack):
        if _same(frame.filename, path):
            return False
        where = os.path.abspath(frame.filename)
        if where.startswith(package + os.sep) and where not in patched:
            return True
    return False


def refused_by_stand_in(err: BaseException) -> bool:
    """A call the stand-in's signature refuses before any of its code runs (a decoder-only training
    step calling the encoder-decoder stand-in with one sequence: `Recorded.forward() missing 1
    required positional argument: 'tgt'`; a search calling `model.decode(ys, h)`, its own model's
    interface, on the Annotated Transformer's `decode(memory, src_mask, ys, tgt_mask)`): the message
    names a class of handformer's grader."""
    import re
    import sys

    match = re.match(r"(\w+)\.\w+\(\) (missing|takes|got)", str(err))
    if isinstance(err, AttributeError):  # an attribute the stand-in has not: Raschka's model.cfg
        match = re.match(r"'(\w+)' object has no attribute", str(err))
    elif not isinstance(err, TypeError):
        return False
    if match is None:
        return False
    held = [getattr(m, "__dict__", {}) for name, m in list(sys.modules.items())  # (None: a failed import)
            if name.startswith("handformer.check")]
    return any(isinstance(names.get(match.group(1)), type) for names in held)


def _same(a: str, b: str) -> bool:
    import os

    return quietly(lambda: os.path.samefile(a, b), OSError, a == b)


def _is_memory(err: BaseException) -> bool:
    return isinstance(err, MemoryError) or "can't allocate memory" in str(err) or (
        "not enough memory" in str(err))


GLOBAL_LOADS = ("LOAD_GLOBAL", "LOAD_NAME")


def global_reads(obj: Any) -> set[str]:
    """The global names a function, or any method of a class, reads (from their code objects; under
    a decorator, `@torch.no_grad()`, the code it wraps)."""
    members = vars(obj).values() if inspect.isclass(obj) else [obj]
    return set().union(*(_code_reads(inspect.unwrap(f).__code__) for f in members if inspect.isfunction(f)))


@functools.lru_cache(maxsize=4096)
def _code_reads(code: types.CodeType, loads: tuple[str, ...] = GLOBAL_LOADS) -> frozenset[str]:
    """The global names (or the names of other `loads`) one code object and the code nested in it (its
    lambdas, comprehensions, inner functions) read; remembered: every check asks again of the same
    functions."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname in loads}
    return frozenset(names).union(*(_code_reads(c, loads) for c in code.co_consts
                                    if isinstance(c, types.CodeType)))


def reads_local(fn: Any, name: str) -> bool:
    """Whether a function's code (a module's forward's), or code nested in it, reads its argument `name`;
    True where there is no code to read."""
    code = getattr(inspect.unwrap(getattr(fn, "forward", fn)), "__code__", None)
    return name in _code_reads(code, LOCAL_LOADS) if code else True


LOCAL_LOADS = ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_DEREF", "LOAD_CLOSURE")  # a local, a closure's cell


Node = TypeVar("Node")


def file_objects(obj: Any) -> dict[str, Any]:
    """The classes and functions defined in the file of `obj` (not the ones it imports), by name."""
    name = getattr(obj, "__module__", None)
    module = vars(sys.modules.get(name, sys))  # (no module: none of its objects)
    return {n: o for n, o in module.items()
            if isinstance(o, (types.FunctionType, type)) and o.__module__ == name}


def reachable(first: Iterable[Node], neighbours: Callable[[Node], set[Node]]) -> set[Node]:
    """`first` and all that `neighbours` leads to from it, in any number of steps (the learner's
    objects a component reads or calls, and theirs in turn); each one's neighbours asked once."""
    reached = set(first)
    todo = list(reached)
    while todo:
        new = neighbours(todo.pop()) - reached
        reached |= new
        todo += new
    return reached


def module_reads(fn: Any) -> list[Any]:
    """The objects of its own module that a function (or a class's methods) reads as globals, in the
    order of their names; an attribute (`self.attention`, `F.softmax`) is not a read of the module."""
    module = getattr(sys.modules.get(fn.__module__), "__dict__", {})
    return [module[name] for name in sorted(global_reads(fn)) if name in module]


def functions_called(fn: Any) -> list[types.FunctionType]:
    """The plain functions of its own file a function reads by name (the TensorFlow tutorial's
    MultiHeadAttention calls its free scaled_dot_product_attention, GPT-2's MLP its gelu_new)."""
    return list(filter(inspect.isfunction, module_reads(fn)))


def methods_called(fn: Any) -> list[types.FunctionType]:
    """The methods of its own class a method calls as `self.name(...)` (a Lightning module's
    configure_optimizers calls its lr_at), and those they call in turn; none for a free function."""
    fn = inspect.unwrap(fn)
    module = sys.modules.get(getattr(fn, "__module__", ""))
    owner = getattr(module, getattr(fn, "__qualname__", "").rpartition(".")[0], None)
    if not inspect.isclass(owner):
        return []
    out: list[types.FunctionType] = []
    todo = [fn]
    while todo:
        names = re.findall(r"\bself\.(\w+)\s*\(", source_text(todo.pop()))
        found = [f for f in (vars(owner).get(n) for n in dict.fromkeys(names)) if inspect.isfunction(f)]
        new = [f for f in found if f not in out and f is not fn]
        todo += new
        out += new
    return out


def config_reads(cls: Any, name: str) -> tuple[set[str], set[str]]:
    """(the keys `name["key"]` and the attributes `name.attr`) that `cls.__init__` reads from its
    argument `name`: how it takes its configuration, from its source."""
    # no lines (and so no reads) where it has no source to read
    lines, _ = quietly(lambda: _function_lines(cls.__init__ if inspect.isclass(cls) else cls),
                       (OSError, TypeError), ([], 0))
    keys, attrs = _reads_of("".join(lines), name)
    return set(keys), set(attrs)


def config_fallbacks(cls: Any, name: str) -> dict[str, str]:
    """The fields of its argument `name` that `cls.__init__` reads as `name.a or name.b`: field a
    overrides field b, so it stands for the same size (OLMo's `config.embedding_size or
    config.vocab_size`, a padded vocabulary): {a: b}."""
    pair = rf"\b{re.escape(name)}\.(\w+)\s+or\s+{re.escape(name)}\.(\w+)\b"
    return dict(re.findall(pair, source_text(getattr(cls, "__init__", None))))


@functools.lru_cache(maxsize=512)
def _reads_of(source: str, name: str) -> tuple[frozenset[str], frozenset[str]]:
    """config_reads of one function's source text (remembered: signatures ask for each argument)."""
    keys, attrs = set(), set()
    tree = quietly(lambda: ast.parse(textwrap.dedent(source)), SyntaxError, ast.Module([], []))  # (none read)
    for node in ast.walk(tree):
        if not isinstance(getattr(node, "value", None), ast.Name) or node.value.id != name:
            continue  # not `name[...]` nor `name.attr`
        if isinstance(node, ast.Attribute):
            attrs.add(node.attr)
        elif isinstance(node, ast.Subscript) and isinstance(getattr(node.slice, "value", None), str):
            keys.add(node.slice.value)  # name["key"]
    return frozenset(keys), frozenset(attrs)
