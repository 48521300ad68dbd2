"""`models[].tokenizer`: the model's Hugging Face tokenizer, read once at startup.

Token ids for clients whose format carries one on every token (TGI streams, LMI token lines)
when the worker gives none (adapters/tokens.py). The file is a `tokenizer.json` (or a model
directory holding one), read with Hugging Face `tokenizers`, the library vLLM and TGI load the
same file with. Managed vLLM and TensorRT-LLM workers serve a model from `upstream_model`; when
that is a local directory with a tokenizer.json, it is the default. Reading a file is I/O, so it
happens here, and adapters get the loaded object.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from adapters import registry, tokens
from gateway import config

FILE = "tokenizer.json"


def tokenizer_file(value: str) -> Path:
    """A tokenizer.json path, or the tokenizer.json inside a model directory."""
    path = Path(value).expanduser()
    return path / FILE if path.is_dir() else path


def load(path: Path, where: str) -> tokens.Vocab:
    """Read one tokenizer file; a ConfigError naming `where` when it cannot be read."""
    from tokenizers import Tokenizer  # only configs that name a tokenizer pay for the import

    try:
        return tokens.Vocab(Tokenizer.from_file(str(path)))
    except Exception as exc:  # tokenizers raises plain Exception for unreadable files
        raise config.ConfigError(
            [f"{where}: {str(path)!r} is not a readable Hugging Face tokenizer.json ({exc})"]
        ) from None


def for_model(m: config.ModelConfig, index: int,
              workers: Iterable[config.WorkerConfig]) -> tokens.Vocab | None:
    """The model's vocabulary: its `tokenizer`, else the tokenizer.json of the local model
    directory a managed worker serves it from (vLLM, TensorRT-LLM: WorkerKind.model_dir),
    else None (ids are then -1, "unknown")."""
    if m.tokenizer:
        return load(tokenizer_file(m.tokenizer), f"models[{index}].tokenizer")
    directory = model_dir(m, workers)
    if directory is not None and (directory / FILE).is_file():
        return load(directory / FILE, f"models[{index}].upstream_model")
    return None


def model_dir(m: config.ModelConfig, workers: Iterable[config.WorkerConfig]) -> Path | None:
    """The local model directory a managed worker serves the model from (`upstream_model`, a
    directory, for a worker kind that loads one: WorkerKind.model_dir), else None."""
    names = {m.name, *m.aliases}
    kinds = registry.WORKER_KINDS
    if any(w.kind in kinds and kinds[w.kind].model_dir and w.model in names for w in workers):
        directory = Path(m.upstream_model or m.name).expanduser()
        if directory.is_dir():
            return directory
    return None
