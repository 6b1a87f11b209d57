"""Where an attention without an output projection has it: Hugging Face BERT's layout splits the
attention in two, `BertSelfAttention` (W_Q, W_K, W_V, the heads) and `BertSelfOutput` (W_O, dropout,
the residual and the norm), composed by `BertAttention`, whose forward hands the first one's output
to the second. Read from the file's source: which class holds the attention and hands its output,
as is, to a class of the file that builds an nn.Linear.
"""

from __future__ import annotations

import ast


def _attributes(cls: ast.ClassDef) -> dict[str, str]:
    """self.attr -> the name of the class its __init__ builds there (`self.output = SelfOutput(c)`)."""
    out = {}
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and isinstance(
                node.value.func, ast.Name):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                        and target.value.id == "self":
                    out[target.attr] = node.value.func.id
    return out


def _called(node: ast.AST) -> str | None:
    """`attr` of a call `self.attr(...)`."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(
            node.func.value, ast.Name) and node.func.value.id == "self":
        return node.func.attr
    return None


def _hands_on(forward: ast.FunctionDef, held: set[str]) -> set[str]:
    """The attributes whose call takes, as its first argument, what a call of a `held` attribute
    returned (directly, or through one variable; the first of a tuple, `outputs[0]`, too)."""
    names = {t.id for n in ast.walk(forward) if isinstance(n, ast.Assign) and _called(n.value) in held
             for t in n.targets if isinstance(t, ast.Name)}
    out = set()
    for node in ast.walk(forward):
        attr = _called(node)
        first = node.args[0] if attr and node.args else None
        first = first.value if isinstance(first, ast.Subscript) else first
        if _called(first) in held or isinstance(first, ast.Name) and first.id in names:
            out.add(attr)
    return out


def projection_elsewhere(source: str, name: str) -> tuple[str, str] | None:
    """(the class that holds `name`, the class of the file it hands name's output to, which builds an
    nn.Linear: the output projection), or None."""
    try:
        classes = {c.name: c for c in ast.walk(ast.parse(source)) if isinstance(c, ast.ClassDef)}
    except SyntaxError:
        return None
    linear = {n for n, c in classes.items() if "Linear(" in (ast.get_source_segment(source, c) or "")}
    for parent in classes.values():
        attrs = _attributes(parent)
        held = {a for a, cls in attrs.items() if cls == name}
        forward = next((f for f in parent.body if isinstance(f, ast.FunctionDef) and f.name == "forward"),
                       None)
        if not held or forward is None:
            continue
        given = [attrs.get(a) for a in _hands_on(forward, held)]
        sibling = next((g for g in given if g in linear and g != name), None)
        if sibling:
            return parent.name, sibling
    return None
