"""What a generation loop takes, read from its form where every prompt form check can hand it raised:
a raise on check's form is not the learner's. check hands token ids (a (B, T) batch, one row, a list of
ints) and its model; a loop written for another form is NOT CHECKED, naming the form, never FAIL:

- its prompt as text: its own file calls it with a string (`create_completion(model, "hello world")`)
  and it encodes the text itself, with a tokenizer check cannot hand it;
- no model: none of its parameters is handed check's model (`generate(tokens, n)` over a weight dict
  of its file's own): what it computes comes from a model check neither built nor can replace.

A raise on a form its own file hands it stays the learner's (a FAIL at their line).
"""

from __future__ import annotations

import ast
import inspect
from typing import Any

from handformer.check.core import fingerprint as fp
from handformer.check.core.argument_names import PROMPT_NAMES
from handformer.check.core.defaults import quietly
from handformer.check.core.source import parsed_file


def handed_text(fn: Any) -> bool:
    """Whether the learner's file calls the loop with its prompt as text: a string literal, or a name
    the file binds to one, bound to its prompt parameter (the first of PROMPT_NAMES, else its second)."""
    fn = quietly(lambda: inspect.unwrap(fn), ValueError, fn)  # @torch.no_grad(): the function it wraps
    signature = quietly(lambda: inspect.signature(fn), (TypeError, ValueError), None)
    filename = quietly(lambda: inspect.getsourcefile(fn), TypeError, None)
    if signature is None or filename is None:
        return False
    names = list(signature.parameters)
    prompt = next((n for n in names if n.lower() in PROMPT_NAMES), [*names[1:2], ""][0])
    nodes = list(ast.walk(parsed_file(filename)))
    bound = [n for n in nodes if _text(getattr(n, "value", None))]  # `prompt = "..."`: its targets
    texts = {getattr(t, "id", "") for n in bound for t in getattr(n, "targets", ())}
    calls = [node for node in nodes if _called(node) == fn.__name__]
    return any(_text(_argument(call, signature).get(prompt), texts) for call in calls)


def _called(node: ast.AST) -> str:
    func = getattr(node, "func", None)
    return getattr(func, "id", getattr(func, "attr", ""))


def _argument(call: Any, signature: inspect.Signature) -> dict[str, Any]:
    """The expressions a call of the loop hands each of its parameters, by name ({} where they do not
    bind)."""
    by_name = {k.arg: k.value for k in call.keywords}
    return quietly(lambda: signature.bind_partial(*call.args, **by_name).arguments, TypeError, {})


def _text(node: Any, texts: frozenset[str] | set[str] = frozenset()) -> bool:
    """A string literal, an f-string, or a name bound to a string literal."""
    return isinstance(getattr(node, "value", None), str) or isinstance(node, ast.JoinedStr) or getattr(
        node, "id", None) in texts


def text_prompt(name: str) -> fp.LearnerFailure:
    """NOT CHECKED: the loop takes its prompt as text, and check hands token ids."""
    return fp.cannot_call(TEXT, TEXT_ZH, {"name": name})


def unhanded_model(name: str, params: list[str]) -> fp.LearnerFailure:
    """NOT CHECKED: no parameter of the loop takes check's model."""
    return fp.cannot_call(NO_MODEL, NO_MODEL_ZH, {"name": name, "params": ", ".join(params) or "none"})


TEXT = ("{name} takes its prompt as text (your file calls it with a string) and encodes it itself; check "
        "hands a loop token ids, and it raised in every form check can hand them ((B, T), one row, a list of "
        "ints): write an adapter that takes ids, decodes them to your text and returns the new ids")
TEXT_ZH = ("{name} 的提示词是文本（你的文件用字符串调用它），由它自己编码；check 给生成循环的是 token id，"
           "各种形式（(B, T)、一行、整数列表）都报错了：请写一个适配函数，接收 id，解码成你的文本，"
           "再返回新的 id")
NO_MODEL = ("{name} takes no model (its parameters: {params}): it runs a model of your file's own, which "
            "check neither built nor can replace, so greedy decoding of check's model is not its reference: "
            "write an adapter that takes the model as its first argument")
NO_MODEL_ZH = ("{name} 不接收模型（它的参数：{params}）：它运行的是你文件里自己的模型，check 没有构建它，"
               "也替换不了，所以 check 的模型的贪心解码不是它的参考：请写一个适配函数，把模型作为第一个参数")
