"""The GSM8K probe's HTTP side: one non-streaming request per prompt, ``concurrency`` in flight.

Two APIs: SGLang's native ``POST /generate`` (``--api sglang``; its ``meta_info`` carries the ``spec_*``
acceptance fields) and the OpenAI-compatible ``POST /v1/completions`` (``--api openai``; any ``spec_*``
keys found in the body, its ``usage``, its first choice or a ``meta_info``/``metadata`` object inside
them are kept, but engines generally send none there).

A failed request never stops the run: connection refused, timeout, transport error, an HTTP error status
and a malformed body (not JSON, or without the fields the API promises) each become a per-request
``error_kind`` and ``error`` message.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

__all__ = ["APIS", "ClientConfig", "MalformedResponse", "parse_response", "request_body", "send_all"]

APIS = ("sglang", "openai")


@dataclass(frozen=True)
class ClientConfig:
    url: str  # server base URL, e.g. http://127.0.0.1:30000
    api: str = "sglang"
    model: str = "default"  # the OpenAI API's "model" field
    timeout_s: float = 600.0  # per request
    max_new_tokens: int = 512
    temperature: float = 0.0
    stop: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.api not in APIS:
            raise ValueError(f"api must be one of {', '.join(APIS)}, got {self.api!r}")

    @property
    def path(self) -> str:
        return "/generate" if self.api == "sglang" else "/v1/completions"


class MalformedResponse(ValueError):
    """A 200 response whose body is not what the API promises."""


def request_body(cfg: ClientConfig, prompt: str) -> dict[str, Any]:
    if cfg.api == "sglang":
        return {"text": prompt, "sampling_params": {"temperature": cfg.temperature,
                                                    "max_new_tokens": cfg.max_new_tokens, "stop": list(cfg.stop)}}
    return {"model": cfg.model, "prompt": prompt, "temperature": cfg.temperature,
            "max_tokens": cfg.max_new_tokens, "stop": list(cfg.stop)}


def _opt_int(obj: Mapping[str, Any], key: str, where: str) -> int | None:
    v = obj.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise MalformedResponse(f"{where}.{key} must be a non-negative int, got {v!r}")
    return v


def _spec_fields(*objs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for obj in objs:
        if not isinstance(obj, Mapping):
            continue
        for k, v in obj.items():
            if isinstance(k, str) and k.startswith("spec_"):
                out.setdefault(k, v)
        for nested in ("meta_info", "metadata"):
            if isinstance(obj.get(nested), Mapping):
                out.update({k: v for k, v in _spec_fields(obj[nested]).items() if k not in out})
    return out


def _finish_type(fr: Any) -> str | None:
    if isinstance(fr, Mapping):
        t = fr.get("type")
        return str(t) if t is not None else None
    return None if fr is None else str(fr)


def parse_response(api: str, content: bytes) -> dict[str, Any]:
    """``output``, ``finish_reason`` (``stop``/``length``/...), ``completion_tokens``, ``prompt_tokens`` and
    ``spec`` (every ``spec_*`` field) from a 200 body; raises :class:`MalformedResponse`."""
    try:
        body = json.loads(content)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedResponse(f"body is not JSON ({exc}): {content[:80]!r}") from None
    if not isinstance(body, dict):
        raise MalformedResponse(f"body is a JSON {type(body).__name__}, not an object")
    if api == "sglang":
        text = body.get("text")
        meta = body.get("meta_info", {})
        if not isinstance(text, str):
            raise MalformedResponse(f"'text' must be a string, got {type(text).__name__}")
        if not isinstance(meta, dict):
            raise MalformedResponse(f"'meta_info' must be an object, got {type(meta).__name__}")
        spec = _spec_fields(meta)
        return {"output": text, "finish_reason": _finish_type(meta.get("finish_reason")),
                "completion_tokens": _opt_int(meta, "completion_tokens", "meta_info"),
                "prompt_tokens": _opt_int(meta, "prompt_tokens", "meta_info"), "spec": spec}
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise MalformedResponse("'choices' must be a non-empty list of objects")
    choice = choices[0]
    if not isinstance(choice.get("text"), str):
        raise MalformedResponse(f"choices[0].text must be a string, got {type(choice.get('text')).__name__}")
    usage = body.get("usage") or {}
    if not isinstance(usage, dict):
        raise MalformedResponse(f"'usage' must be an object, got {type(usage).__name__}")
    return {"output": choice["text"], "finish_reason": _finish_type(choice.get("finish_reason")),
            "completion_tokens": _opt_int(usage, "completion_tokens", "usage"),
            "prompt_tokens": _opt_int(usage, "prompt_tokens", "usage"),
            "spec": _spec_fields(body, usage, choice)}


def _one(client: Any, cfg: ClientConfig, prompt: str) -> dict[str, Any]:
    import httpx

    out: dict[str, Any] = {"ok": False, "output": None, "finish_reason": None, "completion_tokens": None,
                           "prompt_tokens": None, "spec": {}, "http_status": None, "error_kind": None,
                           "error": None}
    t0 = time.perf_counter()
    try:
        resp = client.post(cfg.path, json=request_body(cfg, prompt))
        out["http_status"] = resp.status_code
        if resp.status_code != 200:
            out["error_kind"] = "http"
            out["error"] = f"HTTP {resp.status_code}: {resp.text[:200]}"
        else:
            out.update(parse_response(cfg.api, resp.content))
            out["ok"] = True
    except MalformedResponse as exc:
        out["error_kind"], out["error"] = "malformed", str(exc)
    except httpx.TimeoutException as exc:
        out["error_kind"], out["error"] = "timeout", f"no response within {cfg.timeout_s:g} s ({type(exc).__name__})"
    except httpx.ConnectError as exc:
        out["error_kind"], out["error"] = "connect", f"cannot connect to {cfg.url}: {exc}"
    except httpx.HTTPError as exc:
        out["error_kind"], out["error"] = "transport", f"{type(exc).__name__}: {exc}"
    out["latency_s"] = time.perf_counter() - t0
    return out


def send_all(
    prompts: Sequence[str],
    cfg: ClientConfig,
    concurrency: int,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[dict[str, Any]], float]:
    """Send every prompt with ``concurrency`` requests in flight (submitted in order). Returns one result
    per prompt, in prompt order, and the wall time of the whole batch."""
    import httpx

    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    timeout = httpx.Timeout(cfg.timeout_s, connect=min(cfg.timeout_s, 30.0))
    results: list[dict[str, Any]] = [{} for _ in prompts]
    done = 0
    with httpx.Client(base_url=cfg.url, timeout=timeout, limits=limits) as client, \
            ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="gsm8k") as pool:
        t0 = time.perf_counter()
        futures = {pool.submit(_one, client, cfg, p): i for i, p in enumerate(prompts)}
        for fut, i in futures.items():
            results[i] = fut.result()
            done += 1
            if progress is not None:
                progress(done, len(prompts))
        total = time.perf_counter() - t0
    return results, total
