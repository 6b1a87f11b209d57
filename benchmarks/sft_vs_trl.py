"""Benchmark: one step of handformer's SFT (handformer/tasks/post/sft.py) against TRL's SFTTrainer,
side by side, on the same model and conversations.

A Llama-style model with random weights (built from a config, seeded) is saved as a handformer run
with a ChatML template and exported with `export_hf`; TRL's SFTTrainer (assistant_only_loss, no
packing, float32) loads the export. Both learn the same batches of generated conversations (small
sums, one or two turns): handformer's padded batches, and the same conversations packed into
windows of the block size as a third row. A step is the loop's own work in each: handformer's
`forward_backward`, clipping and AdamW step; TRL's `training_step` (its compute_loss and backward)
with the same clipping and its own optimizer. Rounds are interleaved (handformer, TRL, TRL,
handformer, ...), each continuing its own training, and the median step time over all rounds is
printed with the ratio (target: handformer <= 1.0x TRL's) and both losses after the last round.

    python benchmarks/sft_vs_trl.py
    python benchmarks/sft_vs_trl.py --d-model 128 --layers 2 --threads 1

Needs `trl` (a dev dependency of handformer, pinned). Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from handformer.config import CausalLMConfig  # noqa: E402
from handformer.data.special_tokens import SpecialTokens  # noqa: E402
from handformer.data.tokenizer import Tokenizer  # noqa: E402
from handformer.generation.chat import stop_ids_for  # noqa: E402
from handformer.generation.chat_template import ChatTemplate  # noqa: E402
from handformer.models.causal_lm import CausalLM  # noqa: E402
from handformer.tasks.lm.exports import export_hf  # noqa: E402
from handformer.tasks.lm.run import save_lm_run  # noqa: E402
from handformer.tasks.post.packing import SFTBatches, examples_from  # noqa: E402
from handformer.tasks.post.records import Conversation  # noqa: E402
from handformer.tasks.post.rendering import ConversationRenderer  # noqa: E402
from handformer.tasks.post.sft import sft_loss  # noqa: E402
from handformer.training.loop import TrainConfig, clip_gradients, forward_backward, make_optimizer  # noqa: E402

CHATML = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}"
    "{% generation %}{{ m['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def conversations(n: int, seed: int = 0) -> list[list[dict]]:
    r = random.Random(seed)
    out = []
    for i in range(n):
        turns = []
        for _ in range(1 + i % 2):
            a, b = r.randint(0, 999), r.randint(0, 999)
            turns += [{"role": "user", "content": f"What is {a} plus {b}? Answer with the number only."},
                      {"role": "assistant", "content": f"{a} plus {b} is {a + b}."}]
        out.append([{"role": "system", "content": "You are a careful calculator."}, *turns])
    return out


def build(args: argparse.Namespace, folder: Path, convs: list[list[dict]]) -> Path:
    from tokenizers import AddedToken

    texts = [json.dumps(c) for c in convs]
    tok = Tokenizer.train_bpe(texts, 600)
    roles = ("<|im_start|>", "<|im_end|>")
    tok.hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in roles])
    cfg = CausalLMConfig.from_dict({**CausalLMConfig.llama_style().to_dict(), "vocab_size": tok.vocab_size,
                                    "d_model": args.d_model, "n_heads": args.heads, "n_kv_heads": args.heads,
                                    "d_ff": 4 * args.d_model, "n_layers": args.layers, "max_positions": 256,
                                    "dropout": 0.0})
    torch.manual_seed(0)
    end = tok.hf.token_to_id("<|im_end|>")
    tokens = SpecialTokens(None, tok.eos_id, tok.pad_id, [tok.eos_id, end])
    save_lm_run(folder / "run", CausalLM(cfg), tok, tokens)
    (folder / "run" / "chat_template.jinja").write_text(CHATML)
    export_hf(folder / "run", folder / "hf")
    return folder / "run"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--batch", type=int, default=16, help="conversations a step")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=4, help="timed steps a round")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ["HF_HUB_OFFLINE"] = "1"
    import datasets
    import transformers
    import trl

    folder = Path(tempfile.mkdtemp(prefix="sft_vs_trl_"))
    n_batches = args.rounds * args.steps + 1
    convs = conversations(args.batch * n_batches)
    run_dir = build(args, folder, convs)

    # handformer: the run, its batches (padded like TRL's, and packed)
    from handformer.tasks.lm.run import load_lm

    run = load_lm(run_dir)
    template = ChatTemplate(CHATML, {}, "chatml")
    stops = stop_ids_for(run.tokenizer, run.tokens.eos_ids, template)
    renderer = ConversationRenderer(template, run.tokenizer, stops)
    examples, _ = examples_from([renderer.conversation(Conversation(c)) for c in convs], 256, "truncate")
    pad = run.tokenizer.pad_id
    padded = SFTBatches(examples, args.batch, 256, pad, packing=False, shuffle=False).epoch(0)
    mean_len = sum(len(e.x) for e in examples) / len(examples)
    per_window = max(1, int(256 // mean_len))
    packed = SFTBatches(examples, max(1, args.batch // per_window), 256, pad, packing=True,
                        shuffle=False).epoch(0)
    cfg = TrainConfig(lr=1e-4, warmup=0, label_smoothing=0.0, progress=False, device="cpu")
    loss_fn = functools.partial(sft_loss)
    device = torch.device("cpu")

    def handformer_stepper(batches):
        model = load_lm(run_dir).model.train()
        optimizer = make_optimizer(model, cfg, device)
        state = {"i": 0, "loss": None}

        def step() -> float:
            batch = batches[state["i"] % len(batches)]
            state["i"] += 1
            loss, tokens, _ = forward_backward(model, [batch], loss_fn, device, cfg)
            clip_gradients(model, 1.0, device)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            state["loss"] = loss / tokens
            return state["loss"]
        return step, state

    # TRL: SFTTrainer on the export, its collated batches of the same conversations
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(folder / "hf").float()
    trl_args = trl.SFTConfig(output_dir=str(folder / "trl"), assistant_only_loss=True, packing=False,
                             max_length=256, per_device_train_batch_size=args.batch, report_to="none",
                             use_cpu=True, bf16=False, shuffle_dataset=False, learning_rate=1e-4,
                             max_grad_norm=1.0, logging_strategy="no")
    trainer = trl.SFTTrainer(model=hf_model, args=trl_args, processing_class=transformers.AutoTokenizer
                             .from_pretrained(folder / "hf"),
                             train_dataset=datasets.Dataset.from_list([{"messages": c} for c in convs]))
    trainer.create_optimizer()
    trl_batches = [trainer.data_collator([trainer.train_dataset[j] for j in range(i, i + args.batch)])
                   for i in range(0, len(convs), args.batch)]
    trainer.model.train()
    trl_state = {"i": 0, "loss": None}

    def trl_step() -> float:
        inputs = dict(trl_batches[trl_state["i"] % len(trl_batches)])
        trl_state["i"] += 1
        items = int((inputs["labels"][:, 1:] != -100).sum())
        loss = trainer.training_step(trainer.model, inputs, torch.tensor(items))
        torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), 1.0)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        trl_state["loss"] = float(loss)
        return trl_state["loss"]

    hf_padded, padded_state = handformer_stepper(padded)
    hf_packed, packed_state = handformer_stepper(packed)
    steppers = {"handformer (padded)": hf_padded, "TRL SFTTrainer": trl_step,
                "handformer (packed)": hf_packed}
    for step in steppers.values():  # warm-up: first-call allocations
        step()
    times: dict[str, list[float]] = {name: [] for name in steppers}
    for r in range(args.rounds):
        order = list(steppers) if r % 2 == 0 else list(reversed(steppers))
        for name in order:
            for _ in range(args.steps):
                start = time.perf_counter()
                steppers[name]()
                times[name].append(time.perf_counter() - start)
    n_params = sum(p.numel() for p in run.model.parameters())
    print(f"model: d_model {args.d_model}, {args.layers} layers, {n_params:,} parameters; {args.batch} "
          f"conversations a step (mean {mean_len:.0f} tokens; packed: {len(packed[0].x)} windows of 256); "
          f"threads {torch.get_num_threads()}; {args.rounds} rounds x {args.steps} steps")
    theirs = statistics.median(times["TRL SFTTrainer"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:22s} median step {median * 1000:8.1f} ms   {median / theirs:.2f}x TRL's")
    print(f"loss after the last round: handformer (padded) {padded_state['loss']:.5f}, TRL "
          f"{trl_state['loss']:.5f}, handformer (packed) {packed_state['loss']:.5f}")
    print(f"versions: torch {torch.__version__}, trl {trl.__version__}, "
          f"transformers {transformers.__version__}")


if __name__ == "__main__":
    main()
