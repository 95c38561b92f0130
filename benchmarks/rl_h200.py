"""A real train/rollout precision floor, and a real weight-sync failure caught (docs/rl.md; results in rl_h200.md).

The trainer holds the committed GSM8K Llama (``examples/models/gsm8k-llama-tiny/target``) in float32 and
takes ``--steps`` Adam steps on GSM8K train text (a supervised step standing in for the policy update: what
matters here is that the weights move, about as much per step as a small RL step moves them). Before each
step's update, the rollout engine - the same architecture in bfloat16 - receives the trainer's weights
(cast to bf16: the "weight sync"), samples ``--samples`` responses of up to ``--tokens`` tokens to GSM8K
test questions at temperature 1 (no top-k, no top-p), and returns each sampled token's logprob; the
trainer recomputes the same tokens' logprobs in float32 with its current weights. The records
(``probes.rl.logprobs.LogprobRecorder``) then go to ``validator rl kl``.

Three series share one trainer trajectory and one sampling seed per step:

- ``healthy``: the sync happens every step: the KL is the bf16-vs-float32 floor, measured.
- ``stale-3``: the sync silently fails at steps 12-14 (the engine serves version 11 there), then recovers.
- ``stale-from-10``: the sync stops at step 10 for good (the engine serves version 9 from then on).

At step 13 the script also writes the weight manifests (``probes.rl.weights``) of the trainer's export and of
what the engine holds, for the healthy and the stale series, and diffs them with ``validator manifest diff``.

Usage: python benchmarks/rl_h200.py --out OUT_DIR [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from probes.rl.logprobs import LogprobRecorder  # noqa: E402
from probes.rl.weights import write_manifest  # noqa: E402
from validator.workloads.transformers_models import EOS, ByteTokenizer, load_model  # noqa: E402
from validator.workloads.transformers_pd import load_prompts  # noqa: E402

MODEL = REPO / "examples" / "models" / "gsm8k-llama-tiny" / "target"
TEST = REPO / "tests" / "data" / "gsm8k" / "test.jsonl"
TRAIN = REPO / "tests" / "data" / "gsm8k" / "train.jsonl"
MANIFEST_STEP = 13


def served_version(series: str, step: int) -> int:
    if series == "stale-3" and 12 <= step <= 14:
        return 11
    if series == "stale-from-10" and step >= 10:
        return 9
    return step


def train_texts(n: int) -> list[str]:
    path = TRAIN if TRAIN.is_file() else TEST
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    texts = [f"Question: {r['question']}\nAnswer: {r['answer']}" for r in rows]
    return [texts[i % len(texts)] for i in range(n)]


def sample(engine: Any, prompt: list[int], n: int, tokens: int, seed: int, device: str) -> list[tuple[list[int], list[float]]]:
    """``n`` responses to one prompt, sampled from the engine's full distribution, with their logprobs."""
    torch.manual_seed(seed)
    ids = torch.tensor([prompt], device=device)
    with torch.no_grad():
        g = engine.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0,
                            top_p=1.0, max_new_tokens=tokens, num_return_sequences=n, eos_token_id=EOS,
                            pad_token_id=EOS, output_logits=True, return_dict_in_generate=True)
    out = []
    logits = torch.stack(g.logits, dim=1).float().log_softmax(-1)  # [n, new, vocab]: the raw logits
    for r in range(n):
        toks = g.sequences[r, len(prompt):].tolist()
        if EOS in toks:
            toks = toks[: toks.index(EOS) + 1]
        lps = logits[r, torch.arange(len(toks)), torch.tensor(toks)].tolist()
        out.append((toks, lps))
    return out


def recompute(trainer: Any, prompt: list[int], toks: list[int], device: str) -> list[float]:
    ids = torch.tensor([prompt + toks], device=device)
    with torch.no_grad():
        lp = trainer(input_ids=ids, use_cache=False).logits[0].float().log_softmax(-1)
    rows = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(toks), device=device)
    return lp[rows, torch.tensor(toks, device=device)].tolist()


def run(cmd: list[str], out: Path, name: str) -> int:
    proc = subprocess.run([sys.executable, "-m", "validator", *cmd], capture_output=True, text=True, cwd=REPO)
    (out / name).write_text(f"$ validator {' '.join(cmd)}\n{proc.stdout}{proc.stderr}exit {proc.returncode}\n")
    print(f"$ validator {' '.join(cmd)}: exit {proc.returncode}", flush=True)
    print(proc.stdout[-2500:], flush=True)
    return proc.returncode


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--prompts", type=int, default=4, help="prompts per step")
    p.add_argument("--samples", type=int, default=8, help="responses per prompt")
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--batch", type=int, default=8, help="training sequences per step")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    trainer = load_model(MODEL, dtype="float32", device=args.device)
    engine = load_model(MODEL, dtype="bfloat16", device=args.device)
    tok = ByteTokenizer()
    opt = torch.optim.Adam(trainer.parameters(), lr=args.lr)
    texts = train_texts(args.steps * args.batch)
    prompts = [tok.encode(q) for _, q in load_prompts(TEST, args.steps * args.prompts)]
    versions: list[dict[str, torch.Tensor]] = []  # the trainer's export (bf16) per version
    series = ("healthy", "stale-3", "stale-from-10")
    recs = {s: LogprobRecorder(out / "bundles" / s, part="trainer0", run_name=f"rl-h200-{s}") for s in series}
    losses = []
    for step in range(args.steps):
        versions.append({k: v.detach().to(torch.bfloat16).clone() for k, v in trainer.state_dict().items()})
        trainer.eval()
        for s in series:
            v = served_version(s, step)
            engine.load_state_dict(versions[v])  # the weight sync (or its stale copy)
            if step == MANIFEST_STEP and s in ("healthy", "stale-3"):
                write_manifest(versions[step], out / f"manifest-trainer-step{step}.json", version=step)
                write_manifest(dict(engine.state_dict()), out / f"manifest-engine-{s}-step{step}.json",
                               version=step)  # the version the engine was told it received
            for i in range(args.prompts):
                prompt = prompts[(step * args.prompts + i) % len(prompts)]
                for j, (toks, ro) in enumerate(sample(engine, prompt, args.samples, args.tokens,
                                                      seed=args.seed * 1000 + step * 10 + i, device=args.device)):
                    tr = recompute(trainer, prompt, toks, args.device)
                    recs[s].record_sample(step=step, sample_id=f"p{i}-r{j}", rollout_logprobs=ro, train_logprobs=tr,
                                          weight_version=v)
        # the update: one Adam step on GSM8K train text
        trainer.train()
        batch = [tok.encode(t)[:256] + [EOS] for t in texts[step * args.batch:(step + 1) * args.batch]]
        width = max(len(b) for b in batch)
        ids = torch.tensor([b + [EOS] * (width - len(b)) for b in batch], device=args.device)
        labels = torch.tensor([b + [-100] * (width - len(b)) for b in batch], device=args.device)
        loss = trainer(input_ids=ids, labels=labels, use_cache=False).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(round(float(loss.detach()), 4))
        print(f"step {step}: loss {losses[-1]}", flush=True)
    for r in recs.values():
        r.close()
    gen_s = time.perf_counter() - t0
    (out / "rl_h200.json").write_text(json.dumps({
        "argv": sys.argv[1:], "torch": torch.__version__, "seconds": round(gen_s, 1), "losses": losses,
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"}, indent=1))
    for s in series:
        run(["rl", "kl", str(out / "bundles" / s)], out, f"kl-{s}.txt")
        run(["rl", "kl", str(out / "bundles" / s), "--json"], out, f"kl-{s}.json.txt")
    for s in ("healthy", "stale-3"):
        run(["manifest", "diff", str(out / f"manifest-trainer-step{MANIFEST_STEP}.json"),
             str(out / f"manifest-engine-{s}-step{MANIFEST_STEP}.json")], out, f"manifest-diff-{s}.txt")
    print(f"done in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
