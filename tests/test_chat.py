"""`handformer chat` and `handformer.chat`: history and KV cache kept across turns (the model sees
exactly the re-encoded conversation, and only the tokens the cache lacks are run), streaming, stop
tokens, context overflow, the CLI, and an imported Hugging Face checkpoint chatting as
transformers' apply_chat_template + generate would."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from helpers import randomize_hf
from tokenizers import AddedToken

import handformer
from handformer import cli
from handformer.config import CausalLMConfig
from handformer.data.special_tokens import SpecialTokens
from handformer.data.tokenizer import Tokenizer
from handformer.generation.chat import ChatSession, common_prefix, stop_ids_for
from handformer.generation.chat_template import ChatTemplate
from handformer.generation.generate import generate
from handformer.generation.sampling import SamplingOptions
from handformer.models.causal_lm import CausalLM
from handformer.tasks.lm.run import load_lm, save_lm_run

pytestmark = pytest.mark.usefixtures("one_thread")

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
TEXT = "the quick brown fox jumps over the lazy dog. Hello, who are you? I am a model!"


def _tokenizer():
    tok = Tokenizer.train_char([TEXT])  # one token a character: replies re-encode to the same ids
    tok.hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<|im_start|>", "<|im_end|>")])
    return Tokenizer(tok.hf)


def _model(vocab, max_positions=256, seed=0):
    torch.manual_seed(seed)
    cfg = CausalLMConfig.llama_style(vocab_size=vocab, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64,
                                     n_layers=2, max_positions=max_positions)
    model = CausalLM(cfg).eval()
    with torch.no_grad():  # larger weights: less uniform logits, so replies vary with the prompt
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(20)
    return model


@pytest.fixture
def parts():
    tok = _tokenizer()
    return _model(tok.vocab_size), tok, ChatTemplate(CHATML, {"eos_token": "<|im_end|>"})


def _session(parts, **options):
    model, tok, template = parts
    options = {"temperature": 0, "max_new_tokens": 6, **options}
    stop = options.pop("stop_ids", [tok.hf.token_to_id("<|im_end|>")])
    sampling = SamplingOptions(**{k: options.pop(k) for k in ("temperature", "top_k", "top_p", "seed") if k in options})
    return ChatSession(model, tok, template, stop, sampling=sampling, **options)


def test_cache_carries_over_and_the_model_sees_the_reencoded_conversation(parts):
    model, tok, _ = parts
    session = _session(parts, system="You are a fox.")
    turns = ["Hello, who are you?", "the lazy dog", "jumps over!"]
    for k, text in enumerate(turns):
        before, processed = list(session.context), session.processed
        reply = session.send(text)
        prompt = session.encode(session.messages[:-1])  # the whole conversation, re-encoded
        new = generate(model, [prompt], 6, temperature=0, stop_tokens=session.stop_ids)[0]  # no shared cache
        assert reply == tok.hf.decode(new, skip_special_tokens=True)
        assert session.context == prompt + new[:-1]  # the cache holds exactly these tokens' keys
        run_now = session.processed - processed
        assert run_now == len(session.context) - common_prefix(before, prompt)
        if k:  # only what the cache lacked: the end of the last reply and the new message
            assert common_prefix(before, prompt) == len(before) and run_now < len(prompt)
    assert [m["role"] for m in session.messages] == ["system"] + ["user", "assistant"] * 3


def test_stops_on_any_stop_token_and_streams_the_reply(parts):
    model, tok, _ = parts
    free = _session(parts, max_new_tokens=12)
    free_reply = free.send("Hello")
    stop = free.context[-8]  # a token the greedy reply produced, made a stop token
    pieces = []
    session = _session(parts, max_new_tokens=12, stop_ids=[tok.hf.token_to_id("<|im_end|>"), stop])
    reply = session.send("Hello", on_text=pieces.append)
    assert free_reply.startswith(reply) and len(reply) < len(free_reply)
    assert "".join(pieces) == reply and len(pieces) > 1


def test_sampling_is_seeded(parts):
    replies = [_session(parts, temperature=1.5, top_p=0.9, top_k=20, seed=s, max_new_tokens=10).send("Hi")
               for s in (3, 3, 4)]
    assert replies[0] == replies[1] != replies[2]


def test_context_overflow_drops_oldest_turns_after_system_and_reruns(parts):
    model, tok, template = parts
    model = _model(tok.vocab_size, max_positions=120)
    notes = []
    session = ChatSession(model, tok, template, [tok.hf.token_to_id("<|im_end|>")], system="Be brief.",
                          sampling=SamplingOptions(temperature=0), max_new_tokens=10, notify=notes.append)
    for text in ["the quick brown fox", "jumps over the lazy", "dog. Hello, who", "are you? I am"]:
        session.send(text)
        prompt = session.encode(session.messages[:-1])
        assert len(prompt) + 10 <= 120
        assert session.context[:len(prompt)] == prompt  # after a drop, the prompt was re-run
    drops = [note for note in notes if "dropped" in note]
    assert drops and "dropped the oldest turn (2 messages) and re-ran the prompt" in drops[0]
    assert "the reply reached max_new_tokens=10 before an end-of-turn token and is cut there" in notes
    assert session.messages[0] == {"role": "system", "content": "Be brief."}
    assert session.messages[1]["content"] != "the quick brown fox"
    before = list(session.messages)
    with pytest.raises(ValueError, match=r"does not fit: .*\(max_positions\); shorten it or lower max_new_tokens"):
        session.send("x" * 200)
    assert session.messages == before  # the refused message is not kept


def test_stop_ids_for_finds_end_of_turn_tokens():
    tok = _tokenizer()
    tok.hf.add_special_tokens([AddedToken("<|eot_id|>", special=True)])
    template = ChatTemplate("x", {"eos_token": "<|im_end|>"})
    ids = stop_ids_for(tok, [2], template)
    assert ids == [2, tok.hf.token_to_id("<|im_end|>"), tok.hf.token_to_id("<|eot_id|>")]


@pytest.fixture
def run_dir(tmp_path, parts):
    model, tok, _ = parts
    save_lm_run(tmp_path / "run", model, tok, SpecialTokens(eos_id=None, pad_id=tok.pad_id))
    (tmp_path / "run" / "chat_template.jinja").write_text(CHATML)
    (tmp_path / "run" / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    return tmp_path / "run"


def test_cli_chat_matches_the_python_api(run_dir, capsys, monkeypatch):
    import io

    lines = ["Hello, who are you?", "", "the lazy dog"]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(lines) + "\n"))
    assert cli.main(["chat", str(run_dir), "--system", "Be a fox.", "--temperature", "0",
                     "--max-new-tokens", "7"]) == 0
    out = capsys.readouterr().out
    session = handformer.chat(run_dir, system="Be a fox.", temperature=0, max_new_tokens=7)
    assert out == "".join(session.send(line) + "\n" for line in lines if line)


def test_cli_chat_refuses_runs_without_a_template_and_bad_options(run_dir, capsys, monkeypatch):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("hi\n"))
    assert cli.main(["chat", str(run_dir), "--max-new-tokens", "300"]) == 2
    assert "max_new_tokens=300 leaves no room" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:  # refused as typed, by the parser (test_new_user)
        cli.main(["chat", str(run_dir), "--top-p", "2"])
    assert stopped.value.code == 2 and "argument --top-p: must be a number above 0" in capsys.readouterr().err
    (run_dir / "chat_template.jinja").write_text("{% if false %}x{% endif %}")
    assert cli.main(["chat", str(run_dir)]) == 2
    assert "chat_template.jinja rendered the conversation as no text at all" in capsys.readouterr().err
    (run_dir / "chat_template.jinja").write_text("{{ raise_exception('System role not supported') }}")
    assert cli.main(["chat", str(run_dir), "--system", "x"]) == 2
    assert capsys.readouterr().err.strip().endswith("failed to render: System role not supported")
    (run_dir / "chat_template.jinja").unlink()
    (run_dir / "tokenizer_config.json").unlink()
    assert cli.main(["chat", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {run_dir} has no chat template") and err.count("\n") == 1


def test_chat_refuses_bad_options_and_a_missing_template_before_loading_the_model(run_dir, monkeypatch):
    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before a refusal that needs none")

    monkeypatch.setattr("handformer.tasks.lm.chat.load_lm", no_load)
    for options, message in (({"top_p": 2}, "top_p must be in (0, 1]"), ({"temperature": -1}, "temperature"),
                             ({"max_new_tokens": 0}, "max_new_tokens must be a positive integer")):
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("]", r"\]")):
            handformer.chat(run_dir, **options)
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        handformer.chat(run_dir / "nope")
    (run_dir / "chat_template.jinja").unlink(missing_ok=True)
    (run_dir / "tokenizer_config.json").unlink(missing_ok=True)
    with pytest.raises(ValueError, match="has no chat template"):
        handformer.chat(run_dir)


@torch.no_grad()
def test_imported_checkpoint_chats_as_transformers(tmp_path):
    """A tiny random Llama with a tokenizer and chat template, saved by transformers, imported:
    each turn's reply is HF's greedy generate on HF's apply_chat_template ids for the conversation."""
    tok = _tokenizer()
    tok.save(tmp_path / "tokenizer.json")
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"),
                                                  eos_token="<|im_end|>", chat_template=CHATML)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=256, eos_token_id=tok.hf.token_to_id("<|im_end|>"))
    hf = randomize_hf(transformers.LlamaForCausalLM(cfg), 0.5).eval()
    hf_dir = tmp_path / "hf"
    hf.save_pretrained(hf_dir)
    hf_tok.save_pretrained(hf_dir)
    assert cli.main(["import-hf", str(hf_dir), str(tmp_path / "run")]) == 0
    session = handformer.chat(tmp_path / "run", temperature=0, max_new_tokens=8)
    messages = []
    for text in ["Hello, who are you?", "the quick fox"]:
        messages.append({"role": "user", "content": text})
        ids = hf_tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        ids = torch.tensor([list(ids["input_ids"] if hasattr(ids, "keys") else ids)])
        out = hf.generate(ids, do_sample=False, max_new_tokens=8, pad_token_id=0)[0, ids.size(1):].tolist()
        expected = hf_tok.decode([t for t in out if t != cfg.eos_token_id], skip_special_tokens=True)
        assert session.send(text) == expected
        messages.append({"role": "assistant", "content": expected})
    assert load_lm(tmp_path / "run").tokens.eos_ids == [cfg.eos_token_id]
