import torch

import handformer as hf


def test_models_build_and_run():
    cfg = hf.Seq2SeqConfig(src_vocab_size=50, tgt_vocab_size=60, d_model=32, n_heads=4, d_ff=64,
                           n_encoder_layers=2, n_decoder_layers=2)
    out = hf.Seq2SeqTransformer(cfg)(torch.randint(1, 50, (2, 7)), torch.randint(1, 60, (2, 5)))
    assert out.logits.shape == (2, 5, 60)
    lm = hf.CausalLM(hf.CausalLMConfig.llama_style(vocab_size=50, d_model=32, n_heads=4, n_kv_heads=2,
                                                    d_ff=64, n_layers=2))
    assert lm(torch.randint(0, 50, (3, 9))).logits.shape == (3, 9, 50)
