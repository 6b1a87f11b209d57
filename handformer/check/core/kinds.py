"""Every kind of component `handformer check` grades, in one table: the names learners give it, what
the report calls it (English, Chinese), and the runner that checks it.

A new kind is one runner module (`handformer/check/runners/<module>.py` with a function
`(Component, Context) -> ComponentResult`) and one row here. The order of the rows is the order of
discovery: a name is checked as the first kind that lists it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    name: str
    names: tuple[str, ...]  # the names tutorials and common variants use, tried in this order
    en: str  # what the report calls it
    zh: str
    runner: str  # "module:function" inside handformer.check.runners


KINDS_TABLE: tuple[Kind, ...] = (
    Kind("causal_mask", ("subsequent_mask", "causal_mask", "make_causal_mask", "create_causal_mask",
                         "generate_square_subsequent_mask", "look_ahead_mask", "create_look_ahead_mask",
                         "generate_causal_mask"),
         "causal mask function", "因果掩码函数", "pieces:check_causal_mask"),
    Kind("mask_helper", ("make_src_mask", "make_tgt_mask", "make_trg_mask", "create_masks", "make_masks",
                         "create_src_mask", "create_tgt_mask", "create_padding_mask", "make_pad_mask",
                         "get_pad_mask", "padding_mask", "make_std_mask", "create_mask", "get_attn_pad_mask"),
         "mask helper", "掩码辅助函数", "mask_helpers:check_mask_helper"),
    Kind("batch_masks", ("Batch",), "batch with its masks (the Annotated Transformer's)",
         "带掩码的 batch（Annotated Transformer 的）", "batch_masks:check_batch"),
    Kind("masked_softmax", ("masked_softmax",), "masked softmax (d2l)", "带屏蔽的 softmax（d2l）",
         "attention:check_masked_softmax"),
    Kind("sdpa", ("scaled_dot_product_attention", "attention", "ScaledDotProductAttention",
                  "scaled_dot_product", "dot_product_attention", "ScaledDotProduct", "DotProductAttention",
                  "ScaleDotProductAttention"),  # hyunwoongko's spelling
         "scaled dot-product attention", "缩放点积注意力", "attention:check_sdpa"),
    Kind("additive_attention", ("AdditiveAttention", "BahdanauAttention", "AdditiveAttn"),
         "additive attention", "加性注意力", "additive:check_additive"),
    Kind("mla", ("MLA", "MultiHeadLatentAttention", "MultiheadLatentAttention", "LatentAttention"),
         "multi-head latent attention (DeepSeek's MLA)", "多头潜在注意力（DeepSeek 的 MLA）",
         "latent:check_latent_attention"),
    Kind("mha", ("MultiHeadAttention", "MultiHeadedAttention", "MultiheadAttention", "MultiHeadSelfAttention",
                 "MHA", "Attention", "SelfAttention", "MultiHeadAttentionLayer",  # bentrevett's
                 "MultiHeadAttentionBlock",  # Umar Jamil's
                 "多头注意力", "多头自注意力"),  # Chinese identifiers, as some Chinese tutorials write them
         "multi-head attention", "多头注意力", "attention:check_mha"),
    Kind("gqa", ("GroupedQueryAttention", "GQA", "GroupedQueryAttn", "GQAttention", "repeat_kv",
                 "repeat_kv_heads"),
         "grouped-query attention", "分组查询注意力（GQA）", "gqa:check_gqa"),
    Kind("causal_attention", ("CausalSelfAttention", "MaskedSelfAttention", "CausalAttention",
                              "MaskedMultiHeadAttention", "CausalMultiHeadAttention"),
         "causal self-attention", "因果自注意力", "attention:check_causal_attention"),
    Kind("rope", ("apply_rotary_emb", "apply_rotary_pos_emb", "apply_rotary", "apply_rope",
                  "precompute_freqs_cis", "RotaryEmbedding", "RotaryPositionalEmbedding",
                  "RotaryPositionEmbedding", "RoPE"),
         "rotary position embedding (RoPE)", "旋转位置编码（RoPE）", "rope:check_rope"),
    Kind("rope_scaling", ("apply_scaling", "apply_rope_scaling", "llama3_scale_freqs", "llama3_rope_scaling",
                          "scale_rope_frequencies", "apply_llama3_scaling"),
         "Llama 3.1's rotary frequency scaling", "Llama 3.1 的旋转频率缩放",
         "rope_scaling:check_rope_scaling"),
    Kind("ffn", ("PositionwiseFeedForward", "PositionWiseFeedForward", "FeedForward", "FFN",
                 "FeedForwardNetwork", "PositionwiseFFN", "PositionWiseFFN", "MLP", "SwiGLU",
                 "SwiGLUFeedForward", "GatedFeedForward", "SwiGLUFFN", "GEGLU", "GeGLU",
                 "FeedFoward",  # Karpathy's lecture spells it so
                 "FeedForwardBlock",  # Umar Jamil's
                 "PositionwiseFeedforwardLayer",  # bentrevett's
                 "PoswiseFeedForwardNet",  # graykode's nlp-tutorial, which the Chinese tutorials copy
                 "前馈网络", "前馈层", "位置前馈网络"),
         "position-wise feed-forward network", "逐位置前馈网络", "pieces:check_ffn"),
    Kind("moe", ("MOEFeedForward", "MoEFeedForward", "MoE", "MoELayer", "MoeLayer", "SparseMoE",
                 "SparseMoeBlock", "SparseMoEBlock", "MixtureOfExperts", "MoEBlock", "MoeBlock",
                 "SparseMixtureOfExperts"),
         "sparse mixture of experts", "稀疏混合专家（MoE）", "moe_layer:check_moe"),
    Kind("layernorm", ("LayerNorm", "LayerNormalization", "LayerNormalisation", "LayerNorm1d", "层归一化"),
         "LayerNorm", "层归一化 LayerNorm", "pieces:check_norm"),
    Kind("rmsnorm", ("RMSNorm", "RmsNorm", "RMSNormalization"), "RMSNorm", "RMSNorm", "pieces:check_norm"),
    Kind("positional_encoding", ("PositionalEncoding", "SinusoidalPositionalEncoding", "PositionEncoding",
                                 "SinusoidalPositionEncoding", "PositionalEmbedding", "位置编码",
                                 "SinusoidalPositionalEmbedding",  # fairseq's, Marian's
                                 # functions that make the table: the TensorFlow tutorial's, Whisper's,
                                 # tensor2tensor's, and common spellings
                                 "positional_encoding", "sinusoids", "get_timing_signal_1d",
                                 "get_sinusoid_encoding_table", "sinusoidal_positional_encoding",
                                 "get_positional_encoding", "position_encoding", "sinusoidal_encoding"),
         "sinusoidal positional encoding", "正弦位置编码", "pieces:check_positional_encoding"),
    Kind("add_norm", ("AddNorm", "AddAndNorm", "AddNormalization"), "Add & Norm (d2l's AddNorm)",
         "Add & Norm（d2l 的 AddNorm）", "layers:check_add_norm"),
    Kind("encoder_layer", ("EncoderLayer", "TransformerEncoderLayer", "EncoderBlock",
                           "TransformerEncoderBlock", "编码器层"),
         "encoder layer", "编码器层", "layers:check_encoder_layer"),
    Kind("decoder_layer", ("DecoderLayer", "TransformerDecoderLayer", "DecoderBlock",
                           "TransformerDecoderBlock", "解码器层"),
         "decoder layer", "解码器层", "layers:check_decoder_layer"),
    Kind("block", ("DecoderOnlyBlock", "GPTBlock", "TransformerBlock", "Block", "DecoderOnlyLayer",
                   "GPTLayer", "LlamaBlock", "LlamaDecoderLayer"),
         "decoder-only block", "decoder-only Block", "layers:check_block"),
    Kind("transformer", ("Transformer", "EncoderDecoder", "Seq2SeqTransformer", "TransformerModel",
                         "Seq2Seq"),
         "encoder-decoder model", "编码器-解码器模型", "model:check_model"),
    Kind("gpt", ("GPT", "GPTModel", "GPTLanguageModel", "GPTLM", "MiniGPT", "NanoGPT", "GPT2",
                 "DecoderOnlyTransformer", "DecoderOnlyLM", "CausalLM"),
         "decoder-only model (GPT)", "decoder-only 模型（GPT）", "gpt:check_gpt"),
    Kind("classifier", ("EncoderClassifier", "BertClassifier", "BERTClassifier", "TransformerClassifier",
                        "EncoderForClassification", "BertForSequenceClassification", "BertForClassification",
                        "SentenceClassifier", "TextClassifier", "TransformerEncoderClassifier"),
         "encoder-only classifier", "encoder-only 分类模型", "classifier:check_classifier"),
    Kind("encoder_model", ("BertModel", "BERTModel", "BertEncoderModel", "EncoderOnlyModel", "RobertaModel",
                           "EncoderOnlyTransformer"),
         "encoder-only model (BERT)", "encoder-only 模型（BERT）", "encoder_model:check_encoder_model"),
    Kind("kv_cache", ("CachedLlama", "LlamaWithCache", "CachedGPT", "GPTWithCache", "CachedTransformer",
                      "CachedLM", "CachedDecoder"),
         "model with a KV cache", "带 KV 缓存的模型", "kv_cache:check_kv_cache"),
    Kind("cached_decoder", (), "decoder with a KV cache (encoder-decoder)", "带 KV 缓存的解码器（编码器-解码器）",
         "cached_decoder:check_cached_decoder"),  # found by what it builds and takes (discovery.py)
    Kind("llama2c", ("load_llama2c", "load_llama2c_model", "from_llama2c", "read_llama2c_model",
                     "load_stories", "load_checkpoint_llama2c"),
         "llama2.c checkpoint in your model", "装进你的模型的 llama2.c 权重", "llama2c:check_llama2c"),
    Kind("temperature", ("apply_temperature", "temperature_scaling", "scale_logits", "apply_temp",
                         "temperature_scale", "scale_by_temperature"),
         "temperature", "温度（temperature）", "sampling:check_temperature"),
    Kind("top_k", ("top_k_filter", "top_k_logits", "top_k_filtering", "apply_top_k", "topk_filter",
                   "top_k", "filter_top_k"),
         "top-k filter", "top-k 过滤", "sampling:check_top_k"),
    Kind("top_p", ("top_k_top_p_filtering", "top_k_top_p_filter", "top_p_filter", "top_p_filtering",
                   "nucleus_filter", "top_p_logits", "apply_top_p",
                   "top_p", "filter_top_p", "nucleus_filtering"),
         "top-p (nucleus) filter", "top-p（核采样）过滤", "sampling:check_top_p"),
    Kind("min_p", ("min_p_filter", "min_p_filtering", "min_p_logits", "apply_min_p", "filter_min_p", "min_p"),
         "min-p filter", "min-p 过滤", "sampling:check_min_p"),
    Kind("repetition_penalty", ("apply_repetition_penalty", "repetition_penalty", "apply_repeat_penalty",
                                "repetition_penalty_filter", "enforce_repetition_penalty",
                                "penalize_repetition", "apply_rep_penalty"),
         "repetition penalty", "重复惩罚", "repetition:check_repetition_penalty"),
    Kind("greedy", ("greedy", "greedy_pick", "greedy_next_token", "greedy_sample", "argmax_sample",
                    "sample_greedy", "greedy_step", "pick_greedy"),
         "greedy choice (argmax)", "贪心选择（argmax）", "sampling:check_greedy"),
    Kind("sample", ("sample_next_token", "sample_token", "sample_logits", "sample_from_logits",
                    "sample_next", "next_token", "sample", "sample_top_p", "sample_top_k"),
         "sampling step", "采样一步", "sampling:check_sample"),
    Kind("schedule", ("rate", "noam_rate", "noam_schedule", "noam_lr", "get_lr", "lr_schedule",
                      "get_lr_schedule", "learning_rate_schedule", "get_lr_cosine_schedule",
                      "cosine_schedule", "cosine_lr", "get_cosine_lr", "lr_lambda", "warmup_schedule",
                      "get_learning_rate", "lr_at", "inverse_sqrt_schedule", "transformer_lr",
                      "make_scheduler", "get_scheduler", "build_scheduler", "create_scheduler",
                      "get_cosine_schedule_with_warmup"),
         "learning-rate schedule", "学习率调度", "schedule:check_schedule"),
    Kind("loss", ("masked_cross_entropy", "cross_entropy_loss", "cross_entropy", "compute_loss", "loss_fn",
                  "lm_loss", "seq2seq_loss", "label_smoothed_nll_loss", "label_smoothing_loss",
                  "smoothed_cross_entropy", "LabelSmoothing", "LabelSmoothingLoss",
                  "LabelSmoothingCrossEntropy", "MaskedCrossEntropy", "CrossEntropyLoss",
                  "SmoothedCrossEntropy", "masked_nll_loss", "MaskedSoftmaxCELoss",
                  "LabelSmoothedCrossEntropyCriterion", "LabelSmoothedCrossEntropy",  # fairseq's
                  "label_smoothed_cross_entropy", "cal_loss"),
         "loss", "损失函数", "loss:check_loss"),
    Kind("sequence_logps", ("get_batch_logps", "_get_batch_logps", "get_batch_logprobs", "sequence_logps",
                             "get_sequence_logps", "compute_logps", "get_logps"),
         "sequence log-probability (DPO)", "序列的 log 概率（DPO）", "preference:check_sequence_logps"),
    Kind("dpo_loss", ("dpo_loss", "preference_loss", "compute_dpo_loss", "dpo_loss_fn"),
         "DPO loss", "DPO 损失", "preference:check_dpo_loss"),
    Kind("greedy_decode", ("greedy_decode", "greedy_search", "greedy_decoding", "decode_greedy",
                           "greedy_translate", "translate_greedy"),
         "greedy decoding (encoder-decoder)", "贪心解码（编码器-解码器）", "decoding:check_greedy_decode"),
    Kind("beam_search", ("beam_search", "beam_decode", "beam_search_decode", "translate_beam",
                         "beam_translate", "beam_search_translate", "beam_decoding", "batch_beam_search",
                         "beam_search_batch", "batched_beam_search"),
         "beam search", "束搜索", "beam:check_beam_search"),
    Kind("optimizer", ("AdamW", "Adam", "AdamWOptimizer", "MyAdamW", "ManualAdamW", "SimpleAdamW"),
         "optimizer (AdamW by hand)", "优化器（手写的 AdamW）", "optimizer:check_optimizer"),
    Kind("adam_step", ("adamw_train_step",), "training step with AdamW written in it",
         "自己写 AdamW 更新的训练一步", "adam_step:check_adam_step"),
    Kind("lm_train_step", ("lm_train_step", "train_lm_step", "gpt_train_step", "lm_step", "lm_training_step"),
         "language model's training step", "语言模型的训练一步", "lm_train_step:check_lm_train_step"),
    Kind("train_step", ("train_step", "training_step", "train_batch", "train_one_step", "train_on_batch",
                        "step_fn", "fit_batch", "run_train_step"),
         "training step", "训练一步", "train_step:check_train_step"),
    Kind("train_epoch", ("train_epoch", "train_one_epoch", "run_train_epoch", "fit_epoch", "epoch_train",
                         "train_loop"),
         "training epoch", "训练一个 epoch", "train_step:check_train_epoch"),
    Kind("generate", ("generate", "generate_text", "greedy_generate", "sample_generate", "generate_tokens",
                      "autoregressive_generate", "generate_cached", "generate_with_cache", "cached_generate",
                      ".generate"),
         "generation loop", "生成循环", "generate_own:check_generate"),
    Kind("bpe", ("train_bpe", "bpe_train", "train_bpe_tokenizer", "train_tokenizer", "run_train_bpe",
                 "learn_bpe", "train_byte_level_bpe"),
         "BPE trainer", "BPE 训练", "bpe:check_bpe"),
    Kind("bpe_tokenizer", ("Tokenizer", "BPETokenizer", "BpeTokenizer", "ByteLevelBPETokenizer",
                           "BPE", "bpe_encode", "encode_bpe", "encode"),
         "BPE encoder and decoder", "BPE 编码与解码", "bpe_trainable:check_tokenizer"),
)

KINDS_BY_NAME = {k.name: k for k in KINDS_TABLE}
