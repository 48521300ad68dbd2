"""A small Hugging Face tokenizer.json for the simulator's vocabulary, made with `tokenizers`.

Word-level, each word with its leading blank as one piece (SentencePiece's `▁` convention, so
ids decode back to " the" as the simulator writes it), with the simulator's own ids (simulator/tokens.py: word i is
VOCAB_BASE + i, BOS 1, EOS 2), so ids the gateway reads from this file equal the ids a vLLM
worker reports for the same text. BOS and EOS are special added tokens, as in a real model's
tokenizer.json (`added_tokens[].special`). No download: the file is built in the test.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from simulator import tokens

FILE = "tokenizer.json"


def build(directory: Path) -> Path:
    """Write tokenizer.json into `directory` (a model directory) and return its path."""
    vocab = {"<unk>": 0, tokens.SPECIAL_TEXT[tokens.BOS_ID]: tokens.BOS_ID,
             tokens.SPECIAL_TEXT[tokens.EOS_ID]: tokens.EOS_ID}
    vocab.update({"\u2581" + w[1:]: tokens.VOCAB_BASE + i for i, w in enumerate(tokens.VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    tok.decoder = decoders.Metaspace(prepend_scheme="never")
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<s>", "</s>")])
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / FILE
    tok.save(str(path))
    return path
