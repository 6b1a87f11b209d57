"""A run directory is read once on the way to a chat, an export or a load: `RunDir`."""

from pathlib import Path

import torch

from handformer.config import CausalLMConfig, Seq2SeqConfig
from handformer.data.special_tokens import SpecialTokens
from handformer.data.tokenizer import Tokenizer
from handformer.families import build_causal_lm
from handformer.tasks.lm.chat import chat
from handformer.tasks.lm.exports import export_gguf
from handformer.tasks.lm.run import load_lm, save_lm_run
from handformer.tasks.run_config import RunDir


def _count_config_reads(monkeypatch) -> list[str]:
    reads, read_text = [], Path.read_text

    def counting(self, *args, **kwargs):
        if self.name == "config.json":
            reads.append(str(self))
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counting)
    return reads


def test_chat_export_and_load_read_config_json_once(tmp_path, monkeypatch):
    tok = Tokenizer.train_char(["hello there, how are you?\n"])
    torch.manual_seed(0)
    cfg = CausalLMConfig.llama_style(vocab_size=tok.vocab_size, d_model=32, n_heads=4, n_kv_heads=2, n_layers=1,
                                     d_ff=48, max_positions=64)
    run_dir = tmp_path / "run"
    save_lm_run(run_dir, build_causal_lm(cfg), tok, SpecialTokens(eos_id=2, pad_id=0))
    (run_dir / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    reads = _count_config_reads(monkeypatch)
    chat(run_dir, temperature=0, max_new_tokens=2)
    assert reads == [str(run_dir / "config.json")]
    reads.clear()
    export_gguf(run_dir, tmp_path / "m.gguf")
    assert reads == [str(run_dir / "config.json")]
    reads.clear()
    run = RunDir.read(run_dir)
    assert RunDir.read(run) is run and load_lm(run).model.cfg == cfg and len(reads) == 1


def test_quantize_merge_finetune_translation_and_serve_read_config_json_once(tmp_path, monkeypatch, capsys):
    from argparse import Namespace

    from helpers import make_translation_run

    from handformer.cli.merge import cmd_merge
    from handformer.serve.registry import load_served_models
    from handformer.tasks.lm.finetune import read_base_run
    from handformer.tasks.lm.quantize import quantize_run
    from handformer.tasks.translation.translator import Translator

    runs = Path(__file__).resolve().parent / "fixtures" / "runs"
    translation = make_translation_run(tmp_path / "translation")
    reads = _count_config_reads(monkeypatch)
    quantize_run(runs / "plain", tmp_path / "int8")
    assert reads == [str(runs / "plain" / "config.json")]
    reads.clear()
    cmd_merge(Namespace(run_dir=str(runs / "lora"), out_dir=str(tmp_path / "merged"), overwrite=False))
    assert reads == [str(runs / "lora" / "config.json")]
    reads.clear()
    assert read_base_run(str(runs / "plain")).model_cfg.n_layers == 2 and len(reads) == 1
    reads.clear()
    run = RunDir.read(translation)
    assert Translator.load(run).model.cfg == run.model_config(Seq2SeqConfig)
    load_served_models([f"t={translation}"])
    assert reads == [str(translation / "config.json")] * 2  # RunDir.read, then serve's own read
