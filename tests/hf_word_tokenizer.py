"""A toy Hugging Face tokenizer built here (no download): word-level, lower-cased, an end token
after each text and padding, saved with ``save_pretrained`` as released tokenizer folders are."""

from __future__ import annotations

from pathlib import Path

HF_VOCAB = ["<pad>", "</s>", "<unk>", *"a an of the is while photo drawing red blue circle square first second".split()]


def save_word_tokenizer(directory: Path, vocab: list[str] = HF_VOCAB) -> Path:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="</s>")
    fast.save_pretrained(str(directory))
    return directory
