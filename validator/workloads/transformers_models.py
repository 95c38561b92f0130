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
    "available_memory",
    "check_size",
    "draft_config",
    "load_model",
    "model_config",
    "parameter_count",
    "read_config",
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


# The sizes a config gives that decide what the model allocates, each a whole number >= 1. A model whose
# parameters (estimated from them) do not fit the memory available is refused before anything is allocated.
SIZE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "max_position_embeddings")
MAX_SIZE = 1 << 40  # no size of a real model comes near this; past it, the arithmetic below means nothing


def read_config(spec: str | os.PathLike[str]) -> Any:
    """The transformers config of a ``save_pretrained`` directory or a JSON config file, without weights."""
    transformers = _transformers()
    path = Path(spec)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise InputError(f"{path}: not a model directory (no config.json)")
        try:
            return transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
        except Exception as exc:  # transformers' own errors have no common base class
            raise InputError(f"{path}: cannot read the model config: {type(exc).__name__}: {exc}") from None
    if path.is_file():
        try:
            return model_config(_read_config_file(path))
        except InputError as exc:
            raise InputError(f"{path}: {exc}") from None
    raise InputError(f"{path}: no such model directory or config file")


def _sizes(cfg: Any, where: str) -> dict[str, int]:
    out = {}
    for name in SIZE_FIELDS:
        v = getattr(cfg, name, None)
        if v is None and name in ("head_dim", "num_key_value_heads"):
            continue  # derived from the others
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_SIZE:
            raise InputError(f"{where}: {name} must be a whole number from 1 to {MAX_SIZE:,}, got {v!r}")
        out[name] = v
    out.setdefault("num_key_value_heads", out["num_attention_heads"])
    out.setdefault("head_dim", max(1, out["hidden_size"] // out["num_attention_heads"]))
    return out


def parameter_count(sizes: Mapping[str, int], tied: bool = False) -> int:
    """Parameters of a Llama/Qwen3 decoder of these sizes: embeddings, LM head, and per layer the attention
    projections, the gated MLP and two norms."""
    h, v, i = sizes["hidden_size"], sizes["vocab_size"], sizes["intermediate_size"]
    q = sizes["num_attention_heads"] * sizes["head_dim"]
    kv = sizes["num_key_value_heads"] * sizes["head_dim"]
    layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h
    return v * h * (1 if tied else 2) + sizes["num_hidden_layers"] * layer + h


def available_memory(device: str) -> int:
    """Bytes free to allocate on ``device``: the GPU's free memory, or this machine's available memory (and
    the cgroup's remaining allowance, when lower)."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    free = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if free is None:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        if limit != "max":
            free = min(free, int(limit) - used)
    except (OSError, ValueError):
        pass
    return max(0, free)


def check_size(cfg: Any, *, where: str, dtype: str = "float32", device: str = "cpu") -> int:
    """Refuse (InputError naming the field) a config whose sizes are not whole numbers, or whose parameters
    would not fit the memory available on ``device``; returns the estimated parameter bytes."""
    sizes = _sizes(cfg, where)
    itemsize = 4 if dtype == "float32" else 2
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    need = parameter_count(sizes, tied) * itemsize
    free = available_memory(device)
    if need > free:
        small = {**target_config(), "head_dim": 32}
        derived = sizes["head_dim"] == sizes["hidden_size"] // sizes["num_attention_heads"]  # not given: hidden / heads

        def shrunk(k: str) -> int:
            """The estimate with field ``k`` at the GSM8K target's size (a derived head_dim follows)."""
            trial = {**sizes, k: min(sizes[k], small.get(k, sizes[k]))}
            if derived:
                trial["head_dim"] = max(1, trial["hidden_size"] // trial["num_attention_heads"])
            return parameter_count(trial, tied)

        # the field to blame: the one whose value at the GSM8K target's size shrinks the estimate the most
        blame = min((k for k in sizes if not (derived and k == "head_dim")), key=shrunk)
        raise InputError(
            f"{where}: {blame} {sizes[blame]:,} makes a model of about {need / 2**30:,.1f} GiB of {dtype} parameters, "
            f"more than the {free / 2**30:,.1f} GiB of memory available on {device}; refused before allocating"
        )
    return need


def load_model(spec: str | os.PathLike[str], *, seed: int = 0, dtype: str = "float32", device: str = "cpu",
               attn: str = "sdpa") -> Any:
    """A causal LM in eval mode from a ``save_pretrained`` directory or a JSON config file (random init).
    Its config is read and sized first (:func:`check_size`): a model that cannot fit is never allocated."""
    import torch

    transformers = _transformers()
    path = Path(spec)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"device {device!r} asked for, but torch has no CUDA device here")
    try:
        torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    except KeyError:
        raise InputError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}") from None
    check_size(read_config(path), where=str(path), dtype=dtype, device=device)
    if path.is_dir():
        if not any(path.glob("*.safetensors")):
            raise InputError(f"{path}: no .safetensors weights (pickled checkpoints are not loaded)")
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(
                str(path), dtype=torch_dtype, attn_implementation=attn, use_safetensors=True, local_files_only=True)
        except Exception as exc:  # a corrupt header, a config transformers refuses, missing tensors ...
            raise InputError(f"{path}: cannot load the model: {type(exc).__name__}: {exc}") from None
    else:
        cfg = read_config(path)
        cfg._attn_implementation = attn
        torch.manual_seed(seed)
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch_dtype)
    return model.to(device).eval()
