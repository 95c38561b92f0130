"""Hugging Face transformers at a size that uses the H200: capture cost per decode step, float32 vs bf16
reference, D-only vs PD (docs/transformers.md; results in hf_h200.md).

Parts (``--parts``, in this order):

- ``models``: a Llama-architecture target (Llama-3.2-1B's shapes: width 2048, 8 KV heads of 64, 32 query
  heads, MLP 8192; here 18 layers and the byte vocabulary of ``validator.workloads.transformers_models``, 1.03 B
  parameters), randomly initialised from ``--seed``, saved as bf16 safetensors. No weights can be
  downloaded here and no 1B model can be trained in minutes, so the draft is the target with Gaussian noise
  on every weight (``sigma`` times the tensor's own standard deviation): a draft that agrees with the
  target often but not always. ``sigma`` is picked from ``--sigmas`` as the one whose first-position
  acceptance on 4 prompts is nearest 0.7.
- ``overhead``: greedy ``generate`` of ``--new-tokens`` tokens, detached and with a capture session in
  summary and in full mode (every capture point, and the layer outputs plus logits only), interleaved
  ``--reps`` times in one process. Per decode step = (time of N+1 tokens - time of 1 token) / N.
- ``precision``: the same weights in float32 and in bf16, one teacher-forced forward over each prompt,
  every capture point and all logits captured into two bundles, compared with ``validator compare``;
  also the argmax agreement and the largest log-probability difference, computed here in float64.
- ``pd``: ``validator probe transformers`` in the three modes (d-only, pd, pd-broken) on the saved pair,
  bf16 on the GPU, full capture, then ``validator compare d-only pd`` and ``d-only pd-broken`` with
  ``examples/policies/hf-tiny-pd.toml``.

Usage (H200; the command the results file gives):
    python benchmarks/hf_h200.py --work /tmp/hf1b --out OUT_DIR
Anything runs on the CPU too with ``--device cpu --dtype float32 --tiny`` (a 2-layer model, for checking).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from capture_overhead import DiscardWriter  # noqa: E402  (this folder: the writer that keeps nothing)

from probes.core.capture import ProbeSession  # noqa: E402
from probes.core.config import ProbeConfig  # noqa: E402
from probes.engines.transformers import AssistedAcceptance, HandoffInjector, ModelCapture  # noqa: E402
from validator.workloads.transformers_models import BOS, EOS, VOCAB, ByteTokenizer, load_model  # noqa: E402
from validator.workloads.transformers_pd import decode, load_prompts, prefill  # noqa: E402

PROMPTS = REPO / "tests" / "data" / "gsm8k" / "test.jsonl"
# pd: the target's layer outputs and logits at every step, the draft's logits, both KV caches (not every
# attention and MLP output of both models: ~10x the tensor pairs, and nothing a hand-off changes first)
PD_NAMES = "target.hidden,target.logits,target.k,target.v,draft.logits,draft.k,draft.v"
POLICY = REPO / "examples" / "policies" / "hf-tiny-pd.toml"


def target_config(tiny: bool) -> dict[str, Any]:
    base = {"model_type": "llama", "vocab_size": VOCAB, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0, "tie_word_embeddings": False, "bos_token_id": BOS, "eos_token_id": EOS,
            "pad_token_id": EOS}
    if tiny:
        return {**base, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 8}
    return {**base, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 18,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def log(*a: Any) -> None:
    print(*a, flush=True)


# -- models ------------------------------------------------------------------------------------------


def add_noise(target: Any, draft: Any, sigma: float, seed: int) -> None:
    g = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for (_, p), (_, q) in zip(target.named_parameters(), draft.named_parameters(), strict=True):
            if p.dim() < 2:  # norm weights stay (all ones at init)
                q.copy_(p)
                continue
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.device)
            q.copy_((p.float() + sigma * p.float().std() * noise).to(p.dtype))


def acceptance_of(target: Any, draft: Any, prompts: list[tuple[str, str]], device: str, tokens: int,
                  block: int) -> list[float]:
    tok = ByteTokenizer()
    acc = AssistedAcceptance(None, target, draft)
    inj = HandoffInjector(draft)
    try:
        for rid, text in prompts:
            ids = torch.tensor([tok.encode(text)], device=device)
            acc.begin_request(rid)
            first, tkv, dkv = prefill(target, draft, ids, [])
            acc.begin_request(rid, last_step=0)
            decode(target, draft, ids, first, tkv, dkv, max_new_tokens=tokens, acceptance=acc, injector=inj)
            acc.end_request()
    finally:
        acc.remove()
        inj.remove()
    recs = acc.records
    return [sum(1 for r in recs if r["accepted"] > i and len(r["proposed"]) > i)
            / max(1, sum(1 for r in recs if len(r["proposed"]) > i)) for i in range(block)]


def part_models(args: argparse.Namespace, res: dict[str, Any]) -> None:
    work = Path(args.work)
    cfg_path = work / "target-config.json"
    cfg_path.write_text(json.dumps(target_config(args.tiny)))
    t0 = time.perf_counter()
    target = load_model(cfg_path, seed=args.seed, dtype=args.dtype, device=args.device)
    draft = copy.deepcopy(target)
    for m in (target, draft):
        m.generation_config.num_assistant_tokens = args.block
        m.generation_config.num_assistant_tokens_schedule = "constant"
        m.generation_config.assistant_confidence_threshold = 0.0
    params = sum(p.numel() for p in target.parameters())
    log(f"models: {params / 1e9:.3f} B parameters, built in {time.perf_counter() - t0:.1f} s")
    prompts = load_prompts(PROMPTS, 4)
    sweep = []
    for sigma in args.sigmas if args.sigma is None else []:
        add_noise(target, draft, sigma, args.seed + 1)
        per_pos = acceptance_of(target, draft, prompts, args.device, 32, args.block)
        sweep.append({"sigma": sigma, "per_position": [round(x, 4) for x in per_pos]})
        log(f"sigma {sigma}: acceptance per position {[round(x, 3) for x in per_pos]}")
    sigma = args.sigma if args.sigma is not None else min(
        sweep, key=lambda s: abs(s["per_position"][0] - 0.7))["sigma"]
    add_noise(target, draft, sigma, args.seed + 1)
    target.save_pretrained(work / "target")
    draft.save_pretrained(work / "draft")
    res["models"] = {"parameters": params, "config": target_config(args.tiny), "sigma_sweep": sweep,
                     "sigma": sigma, "dtype": args.dtype, "seconds": round(time.perf_counter() - t0, 1)}


# -- overhead ------------------------------------------------------------------------------------------


LAYERS = {"names": ("target.hidden", "target.logits")}
CONFIGS: dict[str, dict[str, Any] | None] = {
    "detached": None,
    # every hook attached, each returning at once (a disabled session): torch's module-call path with hooks
    # plus one Python call per point, the floor of any capture through module hooks
    "hooks only, all points": {"enabled": False},
    "summary, all points": {"mode": "summary", "defer_summaries": True},
    "full, all points": {"mode": "full"},
    "summary, layers + logits": {"mode": "summary", "defer_summaries": True, **LAYERS},
    "full, layers + logits": {"mode": "full", **LAYERS},
    "summary, all points, every 8th step": {"mode": "summary", "defer_summaries": True, "step_every": 8},
    "summary, layers + logits, every 8th step": {"mode": "summary", "defer_summaries": True, "step_every": 8, **LAYERS},
    "full, layers + logits, every 8th step": {"mode": "full", "step_every": 8, **LAYERS},
    # the same captures, handed to a writer that drops them: the serving thread's own cost, without the
    # bundle writer's thread (its Python shares the GIL with the serving thread)
    "summary, all points, no bundle writer": {"mode": "summary", "defer_summaries": True, "discard": True},
    "summary, layers + logits, inline writer": {"mode": "summary", "defer_summaries": True, "drain": "inline", **LAYERS},
    "summary, all points, inline writer": {"mode": "summary", "defer_summaries": True, "drain": "inline"},
    "summary, layers + logits, no bundle writer": {"mode": "summary", "defer_summaries": True, "discard": True, **LAYERS},
}


DEFAULT_CONFIGS = ";".join(list(CONFIGS)[:5])


def part_overhead(args: argparse.Namespace, res: dict[str, Any]) -> None:
    work = Path(args.work)
    target = load_model(work / "target", dtype=args.dtype, device=args.device)
    tok = ByteTokenizer()
    text = load_prompts(PROMPTS, 1)[0][1]
    ids = torch.tensor([tok.encode(text)], device=args.device)
    n = args.new_tokens
    n_layers = target.config.num_hidden_layers
    wanted = set(args.configs)
    configs = {k: v for k, v in CONFIGS.items() if k in wanted}
    points = {"all points": 3 * n_layers + 2, "layers + logits": n_layers + 1}

    def gen(tokens: int) -> tuple[float, float]:
        """Wall time and the process's CPU time (all threads: the writer's too) of one generate."""
        sync(args.device)
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.no_grad():
            target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
                            min_new_tokens=tokens, do_sample=False, pad_token_id=EOS)
        sync(args.device)
        return time.perf_counter() - t0, time.process_time() - c0

    gen(n + 1)  # warm-up: kernels, allocator
    times: dict[str, list[float]] = {k: [] for k in configs}
    cpu: dict[str, list[float]] = {k: [] for k in configs}
    flush: dict[str, list[float]] = {k: [] for k in configs}
    stats: dict[str, Any] = {}
    for rep in range(args.reps):
        for name, c in configs.items():
            cap = session = None
            if c is not None:
                bundle = work / "overhead" / f"c{list(configs).index(name)}-{rep}"
                shutil.rmtree(bundle, ignore_errors=True)
                kw = {k: v for k, v in c.items() if k != "discard"}
                session = ProbeSession(ProbeConfig(bundle=str(bundle), part="tp0", budget_bytes=None, **kw),
                                       writer=DiscardWriter() if c.get("discard") else None)
                cap = ModelCapture(target, session, role="target").attach()
            per = []
            for tokens in (n + 1, 1):
                if cap is not None:
                    cap.begin_request(f"r{tokens}")
                per.append(gen(tokens))
            times[name].append((per[0][0] - per[1][0]) / n)
            cpu[name].append((per[0][1] - per[1][1]) / n)
            if cap is not None and session is not None:
                cap.detach()
                t0 = time.perf_counter()
                session.close()
                flush[name].append(time.perf_counter() - t0)
                report = session.report()
                stats[name] = {**session.stats, **{k: report[k] for k in (
                    "summaries_modified_in_place", "summaries_deferred_names", "summaries_at_once_names")}}
                shutil.rmtree(work / "overhead", ignore_errors=True)
        log(f"rep {rep}: " + ", ".join(f"{k} {v[-1] * 1e3:.2f} ms" for k, v in times.items()))
    base = statistics.median(times["detached"])
    cpu_base = statistics.median(cpu["detached"])
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        pts = next((v for k, v in points.items() if k in name), 0)
        if "every 8th" in name:
            pts = pts / 8  # points captured per step, on average
        rows.append({"config": name, "points_per_step": pts, "ms_per_step_median": round(med * 1e3, 3),
                     "ms_per_step_all": [round(t * 1e3, 3) for t in ts],
                     "overhead_pct": round((med / base - 1) * 100, 2),
                     "cpu_ms_per_step_median": round(statistics.median(cpu[name]) * 1e3, 3),
                     "cpu_ms_per_step_all": [round(t * 1e3, 3) for t in cpu[name]],
                     "cpu_overhead_pct": round((statistics.median(cpu[name]) / cpu_base - 1) * 100, 2),
                     "us_per_point": round((med - base) / pts * 1e6, 1) if pts else None,
                     "close_s_median": round(statistics.median(flush[name]), 3) if flush[name] else None,
                     "session_stats": stats.get(name)})
        log(f"{name}: {med * 1e3:.2f} ms per decode step, {rows[-1]['overhead_pct']:+.2f}%; CPU "
            f"{rows[-1]['cpu_ms_per_step_median']:.2f} ms, {rows[-1]['cpu_overhead_pct']:+.2f}%")
    res["overhead"] = {"new_tokens": n, "reps": args.reps, "prompt_tokens": int(ids.shape[1]), "rows": rows}


def part_syncs(args: argparse.Namespace, res: dict[str, Any]) -> None:
    """Where the host time of a captured decode step goes: CUDA synchronisations (torch's sync debug mode)
    and the process's Python profile, for 16 decode steps detached and with capture (``--sync-configs``)."""
    import cProfile
    import io
    import pstats
    import warnings
    from collections import Counter

    work = Path(args.work)
    target = load_model(work / "target", dtype=args.dtype, device=args.device)
    ids = torch.tensor([ByteTokenizer().encode(load_prompts(PROMPTS, 1)[0][1])], device=args.device)
    res["syncs"] = {}
    for i, name in enumerate(args.sync_configs):
        c = CONFIGS[name]
        session = cap = None
        if c is not None:
            kw = {k: v for k, v in c.items() if k != "discard"}
            session = ProbeSession(ProbeConfig(bundle=str(work / "syncs" / f"c{i}"), part="tp0", **kw),
                                   writer=DiscardWriter() if c.get("discard") else None)
            cap = ModelCapture(target, session, role="target").attach()

        def gen() -> None:
            if cap is not None:
                cap.begin_request("r")
            with torch.no_grad():
                target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=17, min_new_tokens=17,
                                do_sample=False, pad_token_id=EOS)

        gen()  # warm
        if args.device.startswith("cuda"):
            torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gen()
        if args.device.startswith("cuda"):
            torch.cuda.set_sync_debug_mode(0)
        where = Counter(f"{Path(w.filename).name}:{w.lineno}" for w in caught if "synchroniz" in str(w.message))
        prof = cProfile.Profile()
        prof.enable()
        gen()
        prof.disable()
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf)
        total = stats.total_tt  # type: ignore[attr-defined]
        stats.sort_stats("tottime").print_stats(30)
        if cap is not None and session is not None:
            cap.detach()
            session.close()
        res["syncs"][name] = {"sync_sites": dict(where.most_common(20)), "profiled_s": round(total, 4),
                              "profile": buf.getvalue()[-7000:]}
        log(f"{name}: syncs {dict(where.most_common(8))}")
        log(buf.getvalue()[-3500:])
    shutil.rmtree(work / "syncs", ignore_errors=True)


# -- float32 vs bf16 -------------------------------------------------------------------------------------


def part_precision(args: argparse.Namespace, res: dict[str, Any]) -> None:
    work = Path(args.work)
    out = work / "precision"
    shutil.rmtree(out, ignore_errors=True)
    prompts = load_prompts(PROMPTS, args.limit)
    tok = ByteTokenizer()
    logits: dict[str, list[torch.Tensor]] = {}
    for dtype in ("float32", "bfloat16"):
        model = load_model(work / "target", dtype=dtype, device=args.device)
        session = ProbeSession(ProbeConfig(bundle=str(out / dtype), part="tp0", budget_bytes=None,
                                           run_name=f"hf-{dtype}"))
        cap = ModelCapture(model, session, role="target").attach()
        logits[dtype] = []
        with torch.no_grad():
            for rid, text in prompts:
                cap.begin_request(rid)
                ids = torch.tensor([tok.encode(text)], device=args.device)
                lg = model(input_ids=ids, use_cache=False, logits_to_keep=0).logits[0]
                logits[dtype].append(lg.double().cpu())
        cap.detach()
        session.close()
        del model
        gc.collect()
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    agree = total = 0
    max_dlp = 0.0
    for a, b in zip(logits["float32"], logits["bfloat16"], strict=True):
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        total += a.shape[0]
        max_dlp = max(max_dlp, float((a.log_softmax(-1) - b.log_softmax(-1)).abs().max()))
    res["precision"] = {"prompts": len(prompts), "positions": total, "argmax_agreement": round(agree / total, 5),
                        "max_abs_logprob_diff": round(max_dlp, 5)}
    log(f"precision: argmax agreement {agree}/{total}, max |dlogprob| {max_dlp:.4f}")
    res["precision"]["compare"] = compare(args, out / "float32", out / "bfloat16", "precision-compare", None)


# -- D-only vs PD ------------------------------------------------------------------------------------------


def compare(args: argparse.Namespace, a: Path, b: Path, name: str, policy: Path | None) -> dict[str, Any]:
    out = Path(args.out)
    cmd = [sys.executable, "-m", "validator", "compare", str(a), str(b), "--json"]
    if policy is not None:
        cmd += ["--policy", str(policy)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    secs = time.perf_counter() - t0
    (out / f"{name}.json").write_text(proc.stdout)
    if proc.returncode not in (0, 1, 3):
        log(proc.stderr[-3000:])
    report = subprocess.run(
        [sys.executable, "-c", "import json, sys; from validator.judging.report import format_comparison; "
         "print(format_comparison(json.load(open(sys.argv[1])), limit=40))", str(out / f"{name}.json")],
        capture_output=True, text=True, cwd=REPO)
    (out / f"{name}.txt").write_text(report.stdout + report.stderr)
    log(f"$ validator compare {a.name} {b.name}: exit {proc.returncode} in {secs:.1f} s")
    log("\n".join(report.stdout.splitlines()[:25]))
    return {"exit": proc.returncode, "seconds": round(secs, 1), "report": f"{name}.txt"}


def part_pd(args: argparse.Namespace, res: dict[str, Any]) -> None:
    work = Path(args.work)
    runs = work / "pd"
    shutil.rmtree(runs, ignore_errors=True)
    res["pd"] = {}
    for mode in ("d-only", "pd", "pd-broken"):
        cmd = [sys.executable, "-m", "validator", "probe", "transformers", "--model", str(work / "target"),
               "--draft", str(work / "draft"), "--mode", mode, "--out", str(runs / mode), "--device", args.device,
               "--dtype", args.dtype, "--limit", str(args.limit), "--max-new-tokens", str(args.max_new_tokens),
               "--block", str(args.block), "--capture", "full", "--budget", "16GiB", "--names", PD_NAMES]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
        secs = time.perf_counter() - t0
        log(f"$ validator probe transformers --mode {mode}: exit {proc.returncode} in {secs:.1f} s")
        if proc.returncode != 0:
            log(proc.stderr[-3000:])
            res["pd"][mode] = {"exit": proc.returncode}
            return
        summary = json.loads((runs / mode / "hf-run.json").read_text())
        procs = summary["processes"]
        res["pd"][mode] = {"seconds": round(secs, 1), "processes": [
            {k: p.get(k) for k in ("role", "seconds", "verify_steps", "accepted_per_step", "per_position")}
            for p in procs]}
        log(json.dumps(res["pd"][mode]["processes"]))
    for cand in ("pd", "pd-broken"):
        res["pd"][f"compare d-only {cand}"] = compare(args, runs / "d-only", runs / cand, f"pd-compare-{cand}", POLICY)
    for cand in ("pd", "pd-broken"):  # the default policy: bf16 rounding limits instead of "identical"
        res["pd"][f"compare d-only {cand}, default policy"] = compare(
            args, runs / "d-only", runs / cand, f"pd-compare-{cand}-default", None)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True, help="scratch folder for the models and bundles (several GB)")
    p.add_argument("--out", required=True, help="results: hf_h200.json and the comparison reports")
    p.add_argument("--parts", default="models,overhead,precision,pd")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--tiny", action="store_true", help="a 2-layer model (checking the script on a CPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sigmas", default="0.05,0.1,0.2,0.4")
    p.add_argument("--sigma", type=float, help="the draft's noise; given, no sweep")
    p.add_argument("--block", type=int, default=4)
    p.add_argument("--configs", default=DEFAULT_CONFIGS, help=f"overhead configurations (;-separated), of: {'; '.join(CONFIGS)}")
    p.add_argument("--sync-configs", default="detached;summary, layers + logits;full, layers + logits",
                   help="syncs: the configurations profiled (;-separated)")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--limit", type=int, default=16, help="prompts for precision and pd")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens per prompt in pd")
    args = p.parse_args()
    args.sigmas = [float(x) for x in args.sigmas.split(",")]
    args.sync_configs = [c.strip() for c in args.sync_configs.split(";")]
    args.configs = ["detached"] + [c.strip() for c in args.configs.split(";") if c.strip() != "detached"]
    Path(args.work).mkdir(parents=True, exist_ok=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"argv": sys.argv[1:], "torch": torch.__version__,
                           "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"}
    try:
        import transformers

        res["transformers"] = transformers.__version__
    except ImportError:
        pass
    parts = {"models": part_models, "overhead": part_overhead, "syncs": part_syncs, "precision": part_precision,
             "pd": part_pd}
    for name in args.parts.split(","):
        t0 = time.perf_counter()
        parts[name](args, res)
        gc.collect()
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
        res.setdefault("seconds", {})[name] = round(time.perf_counter() - t0, 1)
        (Path(args.out) / "hf_h200.json").write_text(json.dumps(res, indent=1))
        log(f"== {name} done in {res['seconds'][name]} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
