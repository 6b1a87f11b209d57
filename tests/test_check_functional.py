"""Components check drives by how they are called and what they do, each with a plant of ours that
fails and its correct twin that passes: attention as a function of one head's (n, d) tensors with
an additive mask, a tokenizer class that trains itself (found by its methods), a generation loop
handed an attention mask and a padding id (a left-padded batch, a row that ends first), and d2l's
EncoderDecoder built by the file's own factory and handed the source's valid lengths."""

from __future__ import annotations

from pathlib import Path

import pytest
from check_plants import edited_copy

from handformer.check.core.engine import check_file
from handformer.check.core.report import format_report

FIXTURES = Path(__file__).parent / "fixtures"
HERE = FIXTURES / "learners_functional"


def _statuses(path: Path, only: list[str]) -> tuple[dict[str, str], str]:
    result = check_file(path, only=only)
    return {c.name: c.status for c in result.components}, format_report(result)


@pytest.mark.parametrize("planted", [False, True])
def test_attention_of_one_head_with_an_additive_mask(tmp_path, planted):
    """attention(q, k, v, mask) on (n, d) tensors (k.T transposes all axes of a batched input): driven
    one head of one row at a time; a plant that scales by the number of queries fails at its line."""
    edits = [("math.sqrt(k.shape[-1])", "math.sqrt(q.shape[0])")] if planted else []
    got, report = _statuses(edited_copy(tmp_path, HERE / "functional_attention.py", edits), ["sdpa"])
    assert got == {"attention": "fail" if planted else "pass"}, report
    assert ("line 16: logits = q @ k.T / math.sqrt(q.shape[0])" in report) == planted, report


@pytest.mark.parametrize("planted", [None, "ties", "pattern"])
def test_a_tokenizer_that_trains_itself_is_found_by_its_methods(tmp_path, planted):
    """ByteMerger (no known name) with train, encode and decode: trained on the fixture corpus and
    graded with its own pattern; ties to the pair counted first (minbpe's max(stats, key=stats.get),
    every pair recounted) differ by convention, a pattern one alternative short fails at its line."""
    edits = {None: [], "ties": [("key=lambda p: (counts[p], self.vocab[p[0]], self.vocab[p[1]])", "key=counts.get")],
             "pattern": [(r"|\s+(?!\S)|\s+", r"|\s+")]}[planted]
    got, report = _statuses(edited_copy(tmp_path, HERE / "trainable_tokenizer.py", edits), ["bpe_tokenizer"])
    assert got == {"ByteMerger": {None: "pass", "ties": "differs", "pattern": "fail"}[planted]}, report
    assert ("line 5:" in report) == (planted == "pattern"), report


@pytest.mark.parametrize("planted", [False, True])
def test_a_loop_with_an_attention_mask_is_run_on_a_left_padded_batch(tmp_path, planted):
    """generate(model, input_ids, attention_mask, ..., eos_token_id, pad_token_id) through the stand-in,
    which honours the mask; a row's finished flag that is not kept fails, the EOS line quoted."""
    edits = [("done = done | (step == eos_token_id)", "done = step == eos_token_id")] if planted else []
    got, report = _statuses(edited_copy(tmp_path, HERE / "padded_generate.py", edits), ["generate"])
    assert got == {"generate": "fail" if planted else "pass"}, report
    assert "left-padded batch" in report
    assert ("line 15: done = step == eos_token_id" in report) == planted, report


D2L_MODEL = '''

class Encoder(nn.Module):
    def __init__(self, vocab_size, num_hiddens, ffn_num_hiddens, num_heads, num_blks, dropout):
        super().__init__()
        self.num_hiddens = num_hiddens
        self.embedding = nn.Embedding(vocab_size, num_hiddens)
        self.pos_encoding = PositionalEncoding(num_hiddens, dropout)
        self.blks = nn.Sequential(*[TransformerEncoderBlock(num_hiddens, ffn_num_hiddens, num_heads, dropout)
                                    for _ in range(num_blks)])

    def forward(self, X, valid_lens):
        X = self.pos_encoding(self.embedding(X) * math.sqrt(self.num_hiddens))
        for blk in self.blks:
            X = blk(X, valid_lens)
        return X


class Decoder(nn.Module):
    def __init__(self, vocab_size, num_hiddens, ffn_num_hiddens, num_heads, num_blks, dropout):
        super().__init__()
        self.num_hiddens, self.num_blks = num_hiddens, num_blks
        self.embedding = nn.Embedding(vocab_size, num_hiddens)
        self.pos_encoding = PositionalEncoding(num_hiddens, dropout)
        self.blks = nn.Sequential(*[TransformerDecoderBlock(num_hiddens, ffn_num_hiddens, num_heads, dropout, i)
                                    for i in range(num_blks)])
        self.dense = nn.Linear(num_hiddens, vocab_size)

    def init_state(self, enc_outputs, enc_valid_lens):
        return [enc_outputs, enc_valid_lens, [None] * self.num_blks]

    def forward(self, X, state):
        X = self.pos_encoding(self.embedding(X) * math.sqrt(self.num_hiddens))
        for blk in self.blks:
            X, state = blk(X, state)
        return self.dense(X), state


class EncoderDecoder(nn.Module):
    def __init__(self, encoder, decoder):
        super().__init__()
        self.encoder, self.decoder = encoder, decoder

    def forward(self, enc_X, dec_X, *args):
        enc_outputs = self.encoder(enc_X, *args)
        return self.decoder(dec_X, self.decoder.init_state(enc_outputs, *args))[0]


def seq2seq(src_vocab, tgt_vocab, num_hiddens=16, num_heads=2, num_blks=2):
    encoder = Encoder(src_vocab, num_hiddens, 32, num_heads, num_blks, 0.1)
    decoder = Decoder(tgt_vocab, num_hiddens, 32, num_heads, num_blks, 0.1)
    return EncoderDecoder(encoder, decoder)
'''


EXPLICIT = [("nn.LazyLinear(num_hiddens, bias=bias)", "nn.Linear(num_hiddens, num_hiddens, bias=bias)"),
            ("nn.LazyLinear(ffn_num_hiddens)", "nn.Linear(ffn_num_outputs, ffn_num_hiddens)"),
            ("nn.LazyLinear(ffn_num_outputs)", "nn.Linear(ffn_num_hiddens, ffn_num_outputs)")]


@pytest.mark.parametrize("planted", [False, True])
def test_d2l_encoder_decoder_built_by_its_factory_and_given_valid_lengths(tmp_path, planted):
    """EncoderDecoder(encoder, decoder) built by the function that returns it, forward(enc_X, dec_X,
    *args) handed the source's valid lengths; a plant whose encoder hides no padding fails."""
    path = tmp_path / "d2l_model.py"
    hidden = "enc_outputs = self.encoder(enc_X, None)"  # the plant: the source's padding never hidden
    model = D2L_MODEL.replace("enc_outputs = self.encoder(enc_X, *args)", hidden) if planted else D2L_MODEL
    blocks = (FIXTURES / "learners_d2l" / "correct.py").read_text()
    for lazy, sized in EXPLICIT:  # d2l-zh's layers, sized (a model built by a factory is not warmed up)
        blocks = blocks.replace(lazy, sized)
    path.write_text(blocks + model)
    got, report = _statuses(path, ["transformer"])
    assert got == {"EncoderDecoder": "fail" if planted else "pass"}, report
    assert "valid lengths" in report
