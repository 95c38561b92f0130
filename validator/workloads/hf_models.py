"""Small Hugging Face causal LMs for the transformers workload: a byte-level tokenizer, model configs, loading.

Nothing here downloads. A model is given as

- a directory written by ``save_pretrained`` (``config.json`` + ``model.safetensors``; the committed
  GSM8K-trained pair is in ``examples/models/gsm8k-llama-tiny/{target,draft}``), or
- a JSON config file (``{"model_type": "llama", ...}`` or ``qwen3``): the model is randomly initialised
  from ``--seed`` (for tests and for sizing runs on a device).

Text is tokenised byte by byte: ids 0-255 are the UTF-8 bytes, ``BOS`` = 256, ``EOS`` = 257
(:class:`ByteTokenizer`), so no tokenizer file is needed either.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from validator.errors import InputError

__all__ = [
    "BOS",
    "EOS",
    "VOCAB",
    "ByteTokenizer",
    "draft_config",
    "load_model",
    "model_config",
    "target_config",
]

BOS = 256
EOS = 257
VOCAB = 258
MODEL_TYPES = ("llama", "qwen3")


class ByteTokenizer:
    """UTF-8 bytes as token ids; ``BOS`` starts every prompt, ``EOS`` ends every training document."""

    bos_token_id = BOS
    eos_token_id = EOS
    vocab_size = VOCAB

    def encode(self, text: str, *, bos: bool = True) -> list[int]:
        return ([BOS] if bos else []) + list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


def _transformers() -> Any:
    """transformers, imported on first use (an optional extra: ``pip install 'validator[transformers]'``)."""
    import importlib

    try:
        tf = importlib.import_module("transformers")
    except ImportError:
        raise InputError("Hugging Face transformers is not installed: pip install 'validator[transformers]'") from None
    tf.logging.set_verbosity_error()  # progress bars and deprecation notices from inside generate()
    tf.logging.disable_progress_bar()
    return tf


def target_config(model_type: str = "llama") -> dict[str, Any]:
    """The GSM8K target: 6 layers, width 256, 8 query and 8 KV heads of 32 (8 KV heads: TP8 holds one each)."""
    return {
        "model_type": model_type, "vocab_size": VOCAB, "hidden_size": 256, "intermediate_size": 768,
        "num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 32,
        "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": False, "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": EOS,
    }  # fmt: skip


def draft_config(model_type: str = "llama", layers: int = 2) -> dict[str, Any]:
    """The draft: the target's width and heads, fewer layers (distilled from the target)."""
    return {**target_config(model_type), "num_hidden_layers": layers}


def model_config(cfg: Mapping[str, Any]) -> Any:
    """A transformers config object from a plain dict (``model_type`` picks Llama or Qwen3)."""
    transformers = _transformers()
    d = dict(cfg)
    kind = d.pop("model_type", "llama")
    if kind not in MODEL_TYPES:
        raise InputError(f"model_type must be one of {', '.join(MODEL_TYPES)}, got {kind!r}")
    cls = transformers.LlamaConfig if kind == "llama" else transformers.Qwen3Config
    try:
        return cls(**d)
    except Exception as exc:  # transformers' own validation errors have no common base class
        raise InputError(f"invalid {kind} config: {type(exc).__name__}: {exc}") from None


def _read_config_file(path: Path) -> dict[str, Any]:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"{path}: cannot read the model config: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise InputError(f"{path}: the model config is not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise InputError(f"{path}: the model config must be a JSON object")
    return obj


def load_model(spec: str | os.PathLike[str], *, seed: int = 0, dtype: str = "float32", device: str = "cpu",
               attn: str = "sdpa") -> Any:
    """A causal LM in eval mode from a ``save_pretrained`` directory or a JSON config file (random init)."""
    import torch

    transformers = _transformers()
    path = Path(spec)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"device {device!r} asked for, but torch has no CUDA device here")
    try:
        torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    except KeyError:
        raise InputError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}") from None
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise InputError(f"{path}: not a model directory (no config.json)")
        if not any(path.glob("*.safetensors")):
            raise InputError(f"{path}: no .safetensors weights (pickled checkpoints are not loaded)")
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                str(path), dtype=torch_dtype, attn_implementation=attn, use_safetensors=True, local_files_only=True)
        except Exception as exc:  # a corrupt header, a config transformers refuses, missing tensors ...
            raise InputError(f"{path}: cannot load the model: {type(exc).__name__}: {exc}") from None
    elif path.is_file():
        try:
            cfg = model_config(_read_config_file(path))
        except InputError as exc:
            raise InputError(f"{path}: {exc}") from None
        cfg._attn_implementation = attn
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch_dtype)
    else:
        raise InputError(f"{path}: no such model directory or config file")
    return model.to(device).eval()
