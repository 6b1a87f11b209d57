"""Where a mixture of experts sends each token: `handformer experts RUN TEXT`.

One forward of a language-model run over TEXT, the router logits of every mixture-of-experts layer
taken with hooks (handformer.training.moe_loss.RouterLogits), and a figure of two panels:

- tokens per expert: how many of TEXT's tokens chose each expert among their top k, layer by
  layer (a balanced router gives every expert k * T / E);
- the router's weights in one layer: a row per token, a column per expert, the softmax of the
  router logits, the top-k choices outlined.

Shape legend: T tokens of TEXT, E experts, k experts per token, L mixture layers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from handformer.nn.moe import MixtureOfExperts  # noqa: E402
from handformer.see.captions import captions_for  # noqa: E402
from handformer.see.fonts import label_fonts  # noqa: E402
from handformer.see.plots import save_figure  # noqa: E402
from handformer.tasks.lm.run import load_lm  # noqa: E402
from handformer.training.moe_loss import RouterLogits  # noqa: E402


@dataclass
class ExpertChoices:
    tokens: list[str]  # TEXT's tokens, as text
    probs: list[torch.Tensor]  # per layer (T, E): softmax of the router logits
    chosen: list[torch.Tensor]  # per layer (T, k): the experts each token goes through
    counts: torch.Tensor  # (L, E): tokens that chose each expert, per layer
    top_k: int
    dropped: int = 0  # tokens of TEXT past the model's max_positions, left out


@torch.no_grad()
def expert_choices(run_dir: str | os.PathLike, text: str, device: str = "cpu") -> ExpertChoices:
    """The router's choices for every token of `text` in every mixture layer of the run."""
    run = load_lm(run_dir, device)
    mixtures = [m for m in run.model.modules() if isinstance(m, MixtureOfExperts)]
    if not mixtures:
        raise ValueError(f"{run_dir} is not a mixture of experts (its config has no [model] moe); "
                         "`handformer experts` shows where a router sends tokens")
    ids = ([run.tokens.bos_id] if run.tokens.bos_id is not None else []) + run.tokenizer.encode(text)
    if not ids:
        raise ValueError("TEXT encodes to no tokens; give some text")
    dropped = max(0, len(ids) - run.model.cfg.max_positions)
    ids = ids[: run.model.cfg.max_positions]
    with RouterLogits(run.model) as routers:
        run.model(torch.tensor([ids], device=device))
    top_k, E = mixtures[0].top_k, len(mixtures[0].experts)
    probs = [torch.softmax(logits.float(), dim=-1).cpu() for logits in routers.logits]  # (T, E) each
    chosen = [p.topk(top_k, dim=-1).indices for p in probs]  # (T, k) each
    counts = torch.stack([torch.bincount(c.reshape(-1), minlength=E) for c in chosen])  # (L, E)
    return ExpertChoices([run.tokenizer.decode([i]) for i in ids], probs, chosen, counts, top_k, dropped)


def figure_experts(choices: ExpertChoices, out: str | os.PathLike, lang: str = "en", layer: int = 0) -> Path:
    """Draw `choices` (see the module docstring) into the PNG `out`; `layer`: the weights' panel."""
    text = captions_for(lang)
    L, E = choices.counts.shape
    T = len(choices.tokens)
    if not 0 <= layer < L:
        raise ValueError(f"--layer {layer} is out of range: the run has {L} mixture layers (0..{L - 1})")
    shown = [repr(t)[1:-1].replace(" ", "\u2423") or "\u2423" for t in choices.tokens]  # a space shows as ␣
    with label_fonts([text("experts.title"), *shown]):
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, max(3.5, 0.28 * T + 1.5)),
                                          gridspec_kw={"width_ratios": [1.2, 1]})
        width = 0.8 / L
        for i in range(L):
            left.bar([e + (i - (L - 1) / 2) * width for e in range(E)], choices.counts[i].tolist(), width,
                     label=text("experts.layer", layer=i))
        left.axhline(choices.top_k * T / E, color="black", linestyle="--", linewidth=1,
                     label=text("experts.balanced", k=choices.top_k, T=T, E=E))
        left.set_xticks(range(E))
        left.set_xlabel(text("experts.expert"))
        left.set_ylabel(text("experts.tokens"))
        left.set_title(text("experts.counts"))
        left.legend(fontsize=8)
        image = right.imshow(choices.probs[layer].numpy(), aspect="auto", cmap="Blues", vmin=0.0)
        for t, row in enumerate(choices.chosen[layer].tolist()):
            for e in row:
                right.add_patch(Rectangle((e - 0.5, t - 0.5), 1, 1, fill=False, edgecolor="darkorange",
                                          linewidth=1.5))
        right.set_yticks(range(T), shown, fontsize=8)
        right.set_xticks(range(E))
        right.set_xlabel(text("experts.expert"))
        right.set_title(text("experts.weights", layer=layer, k=choices.top_k))
        fig.colorbar(image, ax=right, fraction=0.05)
        fig.suptitle(text("experts.title"))
        fig.tight_layout()
        out = Path(out)
        save_figure(fig, out, 110)  # atomically: a crash leaves the previous figure, never half of one
        plt.close(fig)
    return out


__all__ = ["ExpertChoices", "expert_choices", "figure_experts"]
