"""`handformer export-hf` for translation runs: the paper's post-norm model as `MarianMTModel`.

A random post-norm run (norm gains and biases randomized, so a swapped or unpermuted tensor shows)
is exported; transformers loads it, and on the same token ids its logits equal handformer's and
its greedy translation equals handformer's greedy decoding.
"""

import pytest
import torch
from helpers import require_module

transformers = require_module("transformers", "pip install -e '.[dev]'")

from handformer.cli import main  # noqa: E402
from handformer.config import Seq2SeqConfig  # noqa: E402
from handformer.data.tokenizer import Tokenizer  # noqa: E402
from handformer.generation.decoding import greedy_decode  # noqa: E402
from handformer.models.seq2seq import Seq2SeqTransformer  # noqa: E402
from handformer.tasks.translation.job import TranslationJob  # noqa: E402
from handformer.tasks.translation.train import save_run_config  # noqa: E402
from handformer.tasks.translation.translator import Translator  # noqa: E402
from handformer.training.checkpoint import save_weights  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
SRC = "the first of may twenty twenty"
TGT = "2020-05-01 1999-12-31"


def _run(tmp_path, shared: bool, **overrides):
    src_tok = Tokenizer.train_char([SRC + " " + TGT] if shared else [SRC])
    tgt_tok = src_tok if shared else Tokenizer.train_char([TGT])
    fields = dict(d_model=32, n_heads=4, d_ff=48, n_encoder_layers=2, n_decoder_layers=2,
                  max_positions=40, src_vocab_size=src_tok.vocab_size, tgt_vocab_size=tgt_tok.vocab_size,
                  share_embeddings=shared, tie_output=shared, dropout=0.0, activation="gelu")
    cfg = Seq2SeqConfig(**{**fields, **overrides})
    torch.manual_seed(0)
    model = Seq2SeqTransformer(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_((1 if name.endswith("weight") else 0) + 0.3 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    src_tok.save(run_dir / "tokenizer.json")
    if not shared:
        tgt_tok.save(run_dir / "tokenizer.target.json")
    save_weights(model, run_dir / "model.safetensors")
    save_run_config(run_dir, cfg, TranslationJob.from_dict({}))
    return run_dir


@pytest.mark.parametrize("shared,bias,tie", [(True, True, None), (False, False, None), (True, True, False),
                                             (False, True, True)])
@torch.no_grad()
def test_marian_export_gives_handformers_logits_and_greedy_output(shared, bias, tie, tmp_path, capsys):
    """Shared source/target embeddings (scaled by sqrt(d_model) on both sides) or not, an output head
    tied to the target embedding or not, 2 encoder layers and 1 decoder layer in the last case."""
    layers = {"n_decoder_layers": 1} if tie else {}
    run_dir = _run(tmp_path, shared, bias=bias, **({} if tie is None else {"tie_output": tie}), **layers)
    out = tmp_path / "marian"
    assert main(["export-hf", str(run_dir), str(out)]) == 0
    printed = capsys.readouterr().out
    assert "exported MarianMTModel" in printed and ("bias=false" in printed) == (not bias)
    translator = Translator.load(run_dir)
    hf = transformers.MarianMTModel.from_pretrained(out).eval()
    assert hf.generation_config.suppress_tokens == [translator.tgt_tok.bos_id]  # as handformer decodes

    src = torch.tensor(translator.encode_sources(["the first of may", "twenty twenty ma"]))  # (B, S)
    bos = translator.tgt_tok.bos_id
    tgt = torch.tensor([[bos] + translator.tgt_tok.encode("2020-05")] * 2)  # (B, T)
    ours = translator.model(src, tgt).logits
    assert ours.std() > 0.5  # far from trivial
    theirs = hf(input_ids=src, attention_mask=(src != translator.model.cfg.pad_id).long(),
                decoder_input_ids=tgt).logits
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)

    limits = translator.limits()
    ours_ids = greedy_decode(translator.model, src[:1], limits)[0].tolist()
    steps = len(ours_ids)
    theirs_ids = hf.generate(src[:1], attention_mask=torch.ones_like(src[:1]), num_beams=1, do_sample=False,
                             max_new_tokens=steps, min_new_tokens=0)[0, 1:].tolist()
    eos = translator.tgt_tok.eos_id
    until_eos = ours_ids[: ours_ids.index(eos) + 1] if eos in ours_ids else ours_ids
    assert len(until_eos) > 3 and theirs_ids[: len(until_eos)] == until_eos


@pytest.mark.parametrize("change,message", [
    ({"norm_placement": "pre"}, "norm_placement='pre' (Marian is post-norm)"),
    ({"position": "learned"}, "position='learned' (Marian's positions are sinusoidal)"),
    ({"scale_embeddings": False, "activation": "swiglu"}, "scale_embeddings=False"),
    ({"norm": "rmsnorm", "n_kv_heads": 2}, "norm='rmsnorm' (Marian uses LayerNorm)"),
])
def test_translation_settings_that_do_not_map_are_named(change, message, tmp_path, capsys):
    run_dir = _run(tmp_path, shared=True, **change)
    assert main(["export-hf", str(run_dir), str(tmp_path / "marian")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot export to MarianMTModel") and message in err
    assert "a run trained with Marian's settings exports" in err and err.count("\n") == 1
