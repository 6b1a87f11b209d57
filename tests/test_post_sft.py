"""Supervised fine-tuning on conversations: the loss learns exactly the assistant's reply and its
end token (for every chat template the project tests, from {% generation %} blocks or from
rendered prefixes, or the template is refused), packed windows give the per-token loss of
unpacked training, TRL's SFTTrainer masks the same positions and computes the same per-token
loss on the first batch, and `handformer train` runs, resumes and chats with the result."""

import json
import random
from pathlib import Path

import pytest
import torch
from helpers import require_module
from post_helpers import (
    CHATML,
    CHATML_MARKED,
    chat_tokenizer,
    conversations,
    make_chat_base,
    model_config,
    quiet_sets,
    write_jsonl,
)
from test_chat_template import SPECIALS, TEMPLATES
from tokenizers import AddedToken

from handformer.cli import main
from handformer.data.tokenizer import Tokenizer
from handformer.generation.chat import stop_ids_for
from handformer.generation.chat_template import ChatTemplate
from handformer.models.causal_lm import CausalLM
from handformer.tasks.lm.exports import export_hf
from handformer.tasks.lm.run import load_lm
from handformer.tasks.post.packing import IGNORE, SFTBatches, best_fit_decreasing, examples_from, in_order
from handformer.tasks.post.records import Conversation, read_conversations
from handformer.tasks.post.rendering import ConversationRenderer
from handformer.tasks.post.sft import per_token_loss, sft_loss

pytestmark = pytest.mark.usefixtures("one_thread")

CONV = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": " Four. "},
        {"role": "user", "content": "And 日本語?"}, {"role": "assistant", "content": "Sure, «x»."}]
# What the loss learns in each template the project tests: the reply as the template writes it,
# and the token that ends the turn; None: the template is refused, and why.
EXPECTED = {
    "llama3": ["Four.<|eot_id|>", "Sure, «x».<|eot_id|>"],  # the template trims the reply
    "qwen2": [" Four. <|im_end|>", "Sure, «x».<|im_end|>"],
    "mistral": [" Four.</s>", " Sure, «x».</s>"],
    "smollm2": [" Four. <|im_end|>", "Sure, «x».<|im_end|>"],  # its {% generation %} blocks
    # their assistant header ends with one more newline than the same turn in a conversation
    "gemma": "is not the start of rendering all of it",
    "phi3": "is not the start of rendering all of it",
}


@pytest.fixture(scope="module")
def special_tokenizer():
    tok = Tokenizer.train_bpe(["Hello there, what is the weather in Paris? Four. Thanks!"] * 5, 300)
    tok.hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    return tok


def learned_runs(tok: Tokenizer, ids: list[int], learned: list[bool]) -> list[str]:
    """The learned tokens as text, one string per run of consecutive learned tokens."""
    runs, current = [], []
    for token, keep in zip(ids, learned):
        if keep:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    return [tok.hf.decode(r, skip_special_tokens=False) for r in runs + ([current] if current else [])]


def renderer_for(name: str, tok: Tokenizer, **kw) -> ConversationRenderer:
    source, bos, eos, _ = TEMPLATES[name]
    template = ChatTemplate(source, {"bos_token": bos or "", "eos_token": eos}, name)
    return ConversationRenderer(template, tok, stop_ids_for(tok, [tok.hf.token_to_id(eos)], template), **kw)


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_the_loss_learns_the_assistants_reply_and_its_end_token_in_every_tested_template(name, special_tokenizer):
    renderer = renderer_for(name, special_tokenizer)
    expected = EXPECTED[name]
    if isinstance(expected, str):
        with pytest.raises(ValueError, match=expected) as err:
            renderer.conversation(Conversation(CONV, 0, None, "chat.jsonl:1"))
        assert name in str(err.value) and "chat.jsonl:1" in str(err.value) and "generation" in str(err.value)
        return
    out = renderer.conversation(Conversation(CONV, 0, None, "chat.jsonl:1"))
    assert learned_runs(special_tokenizer, out.ids, out.learned) == expected
    # a prompt_completion line learns its completion only
    out = renderer.conversation(Conversation(CONV, 3, None, "chat.jsonl:2"))
    assert learned_runs(special_tokenizer, out.ids, out.learned) == expected[1:]
    # train_on_prompt: every token
    everything = renderer_for(name, special_tokenizer, train_on_prompt=True)
    assert all(everything.conversation(Conversation(CONV, 0, None, "x")).learned)


def test_a_template_that_moves_the_system_message_is_refused(special_tokenizer):
    """Mistral's puts the system message into the last user turn: prefixes are not prefixes."""
    with pytest.raises(ValueError, match="mistral cannot show which tokens are the assistant's"):
        renderer_for("mistral", special_tokenizer).conversation(
            Conversation([{"role": "system", "content": "Be brief."}, *CONV], 0, None, "x"))


def test_generation_blocks_mark_what_transformers_marks(special_tokenizer, tmp_path):
    transformers = require_module("transformers", "pip install -e .[dev]")
    source, _, eos, _ = TEMPLATES["smollm2"]
    special_tokenizer.save(tmp_path / "tokenizer.json")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"), eos_token=eos,
                                              chat_template=source)
    renderer = renderer_for("smollm2", special_tokenizer)
    think = [{"role": "user", "content": "/help me"},
             {"role": "assistant", "content": "<think>they want help</think>\nSure."},
             {"role": "user", "content": "/thanks"}, {"role": "assistant", "content": "You're welcome."}]
    for messages in (CONV, think):
        theirs = hf.apply_chat_template(messages, tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True)
        ours = renderer.conversation(Conversation(messages, 0, None, "x"))
        assert ours.ids == list(theirs["input_ids"])
        assert [int(b) for b in ours.learned] == list(theirs["assistant_masks"])


def test_a_turn_without_an_end_token_is_refused(special_tokenizer):
    template = ChatTemplate("{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}"
                            "{% if add_generation_prompt %}assistant: {% endif %}", {}, "plain.jinja")
    renderer = ConversationRenderer(template, special_tokenizer, [special_tokenizer.hf.token_to_id("<|im_end|>")])
    with pytest.raises(ValueError, match="plain.jinja ends the assistant's turn .* never stop"):
        renderer.conversation(Conversation(CONV, 0, None, "x"))


@pytest.mark.parametrize("line, message", [
    ("{not json", "data.jsonl:2 is not valid JSON"),
    ("[1, 2]", "data.jsonl:2 holds a list"),
    ('{"text": "hi"}', 'data.jsonl:2 has no "messages"'),
    ('{"messages": [{"role": "robot", "content": "hi"}]}', "data.jsonl:2: message 0 has role 'robot'"),
    ('{"messages": [{"role": "user", "content": "  "}]}', r"data.jsonl:2: message 0 \(user\) is empty"),
    ('{"messages": [{"role": "user", "content": ["hi"]}]}', "content of type list"),
    ('{"messages": []}', "non-empty list"),
])
def test_bad_lines_name_the_file_and_line(tmp_path, line, message):
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(conversations(1)[0]) + "\n" + line + "\n")
    with pytest.raises(ValueError, match=message):
        read_conversations(path, "messages")


def test_prompt_completion_lines_and_tool_calls(tmp_path):
    path = write_jsonl(tmp_path / "pc.jsonl", [
        {"prompt": "what is 1 plus 1?", "completion": "2"},
        {"prompt": [{"role": "user", "content": "weather?"}],
         "completion": [{"role": "assistant", "content": "", "tool_calls": [
             {"type": "function", "function": {"name": "weather", "arguments": {}}}]},
             {"role": "tool", "content": "sunny"}, {"role": "assistant", "content": "sunny"}]}])
    first, second = read_conversations(path, "prompt_completion")
    assert first.messages == [{"role": "user", "content": "what is 1 plus 1?"},
                              {"role": "assistant", "content": "2"}] and first.train_from == 1
    assert second.train_from == 1 and len(second.messages) == 4
    with pytest.raises(ValueError, match="pc.jsonl:1 has no \"messages\""):
        read_conversations(path, "messages")


def _rendered(n: int, seed: int = 0):
    tok = chat_tokenizer()
    template = ChatTemplate(CHATML_MARKED, {}, "chatml")
    renderer = ConversationRenderer(template, tok, [tok.hf.token_to_id("<|im_end|>")])
    return tok, [renderer.conversation(Conversation(c["messages"])) for c in conversations(n, seed)]


def test_overlong_conversations_are_truncated_or_dropped_and_counted():
    _, rendered = _rendered(12)
    longest = max(len(r.ids) for r in rendered)
    examples, counts = examples_from(rendered, longest - 3, "truncate")
    assert counts.truncated >= 1 and counts.kept == len(examples) == 12 - counts.dropped_empty
    assert all(len(ex.x) <= longest - 3 for ex in examples)
    examples, counts = examples_from(rendered, longest - 3, "drop")
    assert counts.dropped_long >= 1 and counts.kept + counts.dropped_long == 12
    assert "dropped: longer than block_size" in counts.report(longest - 3)


@pytest.mark.parametrize("position, window", [("rope", None), ("rope", 6), ("learned", None), ("sinusoidal", None)])
def test_packed_windows_give_the_per_token_loss_of_unpacked_training(position, window):
    """Attention never crosses a conversation and positions restart in each: the loss of every
    learned token equals its loss in a padded batch and alone (1e-5)."""
    tok, rendered = _rendered(10)
    examples, _ = examples_from(rendered, 96, "truncate")
    torch.manual_seed(0)
    model = CausalLM(model_config(tok.vocab_size, position, sliding_window=window)).eval()
    packed = SFTBatches(examples, 4, 96, tok.pad_id, packing=True, shuffle=False, best_fit=False).epoch(0)
    padded = SFTBatches(examples, 3, 96, tok.pad_id, packing=False, shuffle=False).epoch(0)
    alone = SFTBatches(examples, 1, 96, tok.pad_id, packing=False, shuffle=False).epoch(0)
    assert packed[0].document_ids[0].max() >= 2  # windows really hold several conversations
    with torch.no_grad():
        losses = [torch.cat([per_token_loss(model, b) for b in batches]) for batches in (packed, padded, alone)]
    assert len(losses[0]) == sum(b.n_tokens for b in packed) > 20
    torch.testing.assert_close(losses[0], losses[2], atol=1e-5, rtol=0)
    torch.testing.assert_close(losses[1], losses[2], atol=1e-5, rtol=0)
    with torch.no_grad():
        summed, _ = sft_loss(model, packed[0])
        assert float(summed) == pytest.approx(float(per_token_loss(model, packed[0]).sum()), rel=1e-5)


def test_best_fit_decreasing_packs_every_conversation_once_in_fewer_windows():
    """TRL's bfd: each conversation in one window, none over the block, and fewer windows than
    packing in order (lengths like the reasoning SFT's: short direct replies, long worked ones)."""
    rng = random.Random(0)
    lengths = [rng.choice([rng.randint(20, 40), rng.randint(60, 128)]) for _ in range(500)]
    for pack in (best_fit_decreasing, in_order):
        bins = pack(lengths, 160)
        assert sorted(i for b in bins for i in b) == list(range(500))
        assert max(sum(lengths[i] for i in b) for b in bins) <= 160
    assert len(best_fit_decreasing(lengths, 160)) < 0.9 * len(in_order(lengths, 160))


# --- against TRL's SFTTrainer ---------------------------------------------------------------------

def test_trl_sft_trainer_masks_the_same_positions_and_gets_the_same_first_batch_loss(tmp_path, monkeypatch):
    """The same exported model and data: TRL's assistant_only_loss labels sit on exactly our learned
    tokens, and its per-token and mean losses on the first batch equal ours (1e-5)."""
    trl = require_module("trl", "pip install -e .[dev] (TRL is a pinned dev dependency)")
    datasets = require_module("datasets", "pip install -e .[dev]")
    transformers = require_module("transformers", "pip install -e .[dev]")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    base = make_chat_base(tmp_path / "base", CHATML_MARKED, seed=3)
    export_hf(base, tmp_path / "hf")
    records = conversations(8, seed=5)[:4]
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").float()
    args = trl.SFTConfig(output_dir=str(tmp_path / "trl"), assistant_only_loss=True, packing=False, max_length=96,
                         per_device_train_batch_size=4, report_to="none", use_cpu=True, shuffle_dataset=False,
                         bf16=False)  # TRL defaults to bf16 autocast; the proof is float32 to float32
    trainer = trl.SFTTrainer(model=hf_model, args=args, train_dataset=datasets.Dataset.from_list(records),
                             processing_class=hf_tok)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])  # TRL's first batch, in order
    trainer.model.train()
    trl_mean = float(trainer.compute_loss(trainer.model, dict(batch)))

    run = load_lm(base)
    renderer = ConversationRenderer(ChatTemplate(CHATML_MARKED, {}, "chatml"), run.tokenizer,
                                    stop_ids_for(run.tokenizer, run.tokens.eos_ids, ChatTemplate(CHATML_MARKED)))
    rendered = [renderer.conversation(Conversation(r["messages"])) for r in records]
    for row, r in enumerate(rendered):
        n = len(r.ids)
        assert batch["input_ids"][row, :n].tolist() == r.ids
        assert (batch["labels"][row, :n] != IGNORE).tolist() == r.learned  # the same positions
    examples, _ = examples_from(rendered, 96, "truncate")
    ours = SFTBatches(examples, 4, 96, run.tokenizer.pad_id, packing=True, shuffle=False,
                      best_fit=False).epoch(0)[0]  # in order, as TRL's unpacked rows
    with torch.no_grad():
        our_tokens = per_token_loss(run.model.train(), ours)
        logits = trainer.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        labels = batch["labels"][:, 1:]
        keep = labels != IGNORE
        theirs = torch.nn.functional.cross_entropy(logits[:, :-1][keep].float(), labels[keep], reduction="none")
    torch.testing.assert_close(our_tokens, theirs, atol=1e-5, rtol=0)
    assert float(our_tokens.mean()) == pytest.approx(trl_mean, abs=1e-5)


# --- the command line -----------------------------------------------------------------------------

SFT_SETS = ("train.steps=8", "train.lr=3e-3", "train.warmup=2", "train.eval_every=4", "train.log_every=2",
            "data.batch_size=4", "data.block_size=64")


def sft_config(tmp_path: Path, base: Path, data: Path, **extra) -> Path:
    lines = ['task = "sft"', "[train]", f'init_from = "{base}"', "[data]", f'path = "{data}"']
    lines += [f"{k} = {json.dumps(v)}" for k, v in extra.items()]
    path = tmp_path / "sft.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def metric_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("elapsed_s", "tokens_per_s")} for r in rows]


@pytest.fixture(scope="module")
def sft_inputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sft")
    base = make_chat_base(tmp / "base", CHATML)
    data = write_jsonl(tmp / "chat.jsonl", conversations(40))
    return tmp, base, data


def test_sft_from_the_command_line_chats_and_resumes_to_the_straight_run(sft_inputs, tmp_path, capsys):
    tmp, base, data = sft_inputs
    config = sft_config(tmp_path, base, data)
    straight = tmp_path / "straight"
    constant = ("train.schedule=constant",)  # so the first half's learning rates do not depend on steps
    assert main(["train", "--config", str(config), "--out", str(straight), *quiet_sets(*SFT_SETS, *constant)]) == 0
    out = capsys.readouterr().out
    assert "training: 38 conversations, 6 truncated to block_size=64" in out and "validation: 2 conversations" in out
    config_json = json.loads((straight / "config.json").read_text())
    assert config_json["post_training"] == {"task": "sft", "settings": {}}
    assert config_json["init_from"]["path"] == str(base.resolve())
    assert (straight / "chat_template.jinja").read_text() == CHATML
    rows = metric_rows(straight)
    assert [r["step"] for r in rows] == [2, 4, 6, 8] and "val_loss" in rows[1]

    # resumed: steps 1-4, then 5-8 from the checkpoint, the straight run's metrics
    resumed = tmp_path / "resumed"
    assert main(["train", "--config", str(config), "--out", str(resumed),
                 *quiet_sets(*SFT_SETS, *constant, "train.steps=4")]) == 0
    assert main(["train", "--resume", str(resumed), *quiet_sets("train.steps=8")]) == 0
    got = metric_rows(resumed)
    assert [r["step"] for r in got] == [2, 4, 6, 8]
    for a, b in zip(rows, got):
        assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], rel=1e-5) for k in a)

    from handformer.tasks.lm.chat import chat

    session = chat(straight, temperature=0, max_new_tokens=4)
    assert isinstance(session.send("what is 1 plus 2?"), str)


def test_lora_sft_holds_adapters_and_loads_with_its_base(sft_inputs, tmp_path):
    tmp, base, data = sft_inputs
    config = sft_config(tmp_path, base, data, packing=False)
    run = tmp_path / "lora"
    assert main(["train", "--config", str(config), "--out", str(run),
                 *quiet_sets(*SFT_SETS, "train.steps=4", "train.lora.rank=2", "train.lora.targets=all-linear")]) == 0
    assert (run / "adapters.safetensors").is_file() and not (run / "model.safetensors").exists()
    loaded = load_lm(run)
    assert any("lora" in name for name, _ in loaded.model.named_parameters())


@pytest.mark.parametrize("route", ["hf", "gguf"])
def test_sft_starts_from_an_imported_base_and_chats(sft_inputs, tmp_path, route):
    """A base exported and imported back (import-hf, import-gguf): SFT learns from it and the result
    chats in the template it learned."""
    tmp, base, data = sft_inputs
    imported = tmp_path / "imported"
    if route == "hf":
        assert main(["export-hf", str(base), str(tmp_path / "hf")]) == 0
        assert main(["import-hf", str(tmp_path / "hf"), str(imported)]) == 0
    else:
        assert main(["export-gguf", str(base), str(tmp_path / "base.gguf")]) == 0
        assert main(["import-gguf", str(tmp_path / "base.gguf"), str(imported)]) == 0
    (tmp_path / "chatml.jinja").write_text(CHATML)
    config = sft_config(tmp_path, imported, data, chat_template=str(tmp_path / "chatml.jinja"))
    run = tmp_path / "sft"
    assert main(["train", "--config", str(config), "--out", str(run), *quiet_sets(*SFT_SETS, "train.steps=4")]) == 0
    rows = metric_rows(run)
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]
    assert (run / "chat_template.jinja").read_text() == CHATML
    from handformer.tasks.lm.chat import chat

    assert isinstance(chat(run, temperature=0, max_new_tokens=4).send("what is 1 plus 2?"), str)


@pytest.mark.parametrize("extra, message", [
    ({"chat_template": "missing.jinja"}, "chat_template='missing.jinja': no such file"),
    ({"format": "dialogue"}, "format='dialogue' is invalid"),
    ({"packing": "yes"}, "packing='yes' is invalid"),
    ({"overlong": "cut"}, "overlong='cut' is invalid"),
    ({"block_size": 4096}, "block_size=4096 is invalid"),
])
def test_bad_sft_settings_are_one_clear_error(sft_inputs, tmp_path, capsys, extra, message):
    tmp, base, data = sft_inputs
    config = sft_config(tmp_path, base, data, **extra)
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "run"), *quiet_sets()]) == 2
    assert message in capsys.readouterr().err


def test_sft_needs_a_base_run_and_a_template(sft_inputs, tmp_path, capsys):
    tmp, base, data = sft_inputs
    config = tmp_path / "no_base.toml"
    config.write_text(f'task = "sft"\n[data]\npath = "{data}"\n')
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "a"), *quiet_sets()]) == 2
    assert "init_from is required" in capsys.readouterr().err
    bare = make_chat_base(tmp_path / "bare", CHATML)
    (bare / "chat_template.jinja").unlink()
    assert main(["train", "--config", str(sft_config(tmp_path, bare, data)), "--out", str(tmp_path / "b"),
                 *quiet_sets()]) == 2
    assert "has no chat template" in capsys.readouterr().err and not (tmp_path / "b").exists()
    (tmp_path / "mine.jinja").write_text(CHATML)
    assert main(["train", "--config", str(sft_config(tmp_path, bare, data, chat_template=str(tmp_path / "mine.jinja"))),
                 "--out", str(tmp_path / "c"), *quiet_sets(*SFT_SETS, "train.steps=2")]) == 0
    assert (tmp_path / "c" / "chat_template.jinja").read_text() == CHATML


STORY_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['role'] + ': ' + m['content'] }}"
                  "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{{ '\n' }}{% endfor %}"
                  "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}")


def test_an_imported_llama2c_base_learns_to_chat_with_a_template_written_for_it(tmp_path, capsys):
    """stories260K (imported from llama2.c, no chat template): [data] chat_template gives it one that
    ends the assistant's turn with its EOS; SFT lowers the loss on held-out conversations and the
    run chats in that template."""
    from helpers import dataset_file

    data = dataset_file("stories260K")
    imported = tmp_path / "stories260K"
    assert main(["import-llama2c", str(data / "stories260K.bin"), str(data / "tok512.bin"), str(imported)]) == 0
    (tmp_path / "story.jinja").write_text(STORY_TEMPLATE)
    lines = [{"messages": [{"role": "user", "content": f"Who is friend number {i % 7}?"},
                           {"role": "assistant", "content": ["Tim", "Lily", "Sam", "Ben", "Sue", "Max", "Mia"][i % 7]}]}
             for i in range(60)]
    path = write_jsonl(tmp_path / "friends.jsonl", lines)
    config = sft_config(tmp_path, imported, path, chat_template=str(tmp_path / "story.jinja"), val_fraction=0.1)
    assert main(["train", "--config", str(config), "--out", str(tmp_path / "sft"),
                 *quiet_sets("train.steps=12", "train.lr=3e-3", "train.warmup=1", "train.eval_every=6",
                             "data.batch_size=4", "data.block_size=128")]) == 0
    rows = metric_rows(tmp_path / "sft")
    vals = [r["val_loss"] for r in rows if "val_loss" in r]
    assert vals[-1] < vals[0]
    assert (tmp_path / "sft" / "chat_template.jinja").read_text() == STORY_TEMPLATE
    from handformer.tasks.lm.chat import chat

    assert isinstance(chat(tmp_path / "sft", temperature=0, max_new_tokens=4).send("Who is friend number 1?"), str)
