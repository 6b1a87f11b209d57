"""Translation quality: corpus BLEU and chrF with sacrebleu (never an average of sentence scores)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sacrebleu


@dataclass
class Scores:
    bleu: float  # sacreBLEU on detokenized text (13a tokenization, case-sensitive)
    chrf: float  # chrF2
    bleu_lc_tok: float  # BLEU on lowercased, 13a-tokenized text (how older tutorials report)
    exact_match: float  # fraction of outputs equal to their reference
    n: int
    signature: str  # sacreBLEU's signature of the main BLEU figure

    def format(self) -> str:
        return (f"BLEU {self.bleu:.2f}  chrF {self.chrf:.2f}  BLEU(lowercased, tokenized) "
                f"{self.bleu_lc_tok:.2f}  exact match {100 * self.exact_match:.1f}%  ({self.n} sentences)")


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str]) -> Scores:
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    if not references:
        raise ValueError("no sentences to score")
    bleu = sacrebleu.metrics.BLEU()
    result = bleu.corpus_score(list(hypotheses), [list(references)])
    chrf = sacrebleu.corpus_chrf(list(hypotheses), [list(references)])
    lc = sacrebleu.corpus_bleu(list(hypotheses), [list(references)], lowercase=True, tokenize="13a")
    exact = sum(h.strip() == r.strip() for h, r in zip(hypotheses, references)) / len(references)
    return Scores(result.score, chrf.score, lc.score, exact, len(references), str(bleu.get_signature()))
