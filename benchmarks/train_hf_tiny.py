"""Train the small GSM8K target (Llama architecture, byte-level) and distil smaller drafts from it.

    python benchmarks/train_hf_tiny.py --train GSM8K_TRAIN.jsonl --test GSM8K_TEST.jsonl --out DIR \
        [--device cuda] [--target-steps 6000] [--draft-steps 3000] [--draft-layers 1,2]

Writes ``DIR/target`` and ``DIR/draft-<n>l`` (``save_pretrained``: config.json + model.safetensors in
bfloat16) and ``DIR/train.json`` (steps, losses, seconds, and per draft the per-position acceptance on
the first ``--eval-prompts`` test questions, measured with the weights as saved, upcast to float32).

Deterministic: fixed seeds, fixed step counts, batches drawn from a seeded generator; GPU kernels may
still differ in the last bits between runs (atomics in the backward pass), so a rebuild on another machine
gives a close, not bit-identical, model. Results and the exact command: benchmarks/train_hf_tiny.md.

Training text: ``Question: <q>\\nAnswer: <a>`` + EOS per GSM8K train row, concatenated and cut into
windows of ``--seq`` bytes. The target learns it with cross-entropy (AdamW, warm-up, cosine decay,
bf16 autocast on CUDA). A draft starts from the target's embeddings, final norm, LM head and an evenly
spaced subset of its layers, and is trained to match the target's next-token distribution (KL) on the
same text.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from validator.workloads.transformers_models import EOS, ByteTokenizer, draft_config, model_config, target_config


def load_questions(path: str, limit: int | None = None) -> list[dict[str, str]]:
    """GSM8K JSONL rows (``question``, ``answer``); the first ``limit``."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                obj = json.loads(line)
                rows.append({"question": obj["question"], "answer": obj["answer"]})
            if limit is not None and len(rows) >= limit:
                break
    return rows


def build_prompt(question: str) -> str:
    return f"Question: {question}\nAnswer:"


def corpus(rows: list[dict[str, str]]) -> torch.Tensor:
    tok = ByteTokenizer()
    ids: list[int] = []
    for r in rows:
        ids += tok.encode(f"Question: {r['question']}\nAnswer: {r['answer']}") + [EOS]
    return torch.tensor(ids, dtype=torch.long)


def batches(data: torch.Tensor, seq: int, batch: int, steps: int, seed: int, device: str) -> Any:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, data.numel() - seq - 1, (batch,), generator=g)
        x = torch.stack([data[s : s + seq + 1] for s in starts.tolist()]).to(device, non_blocking=True)
        yield x[:, :-1], x[:, 1:]


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup))))


def train(model: Any, data: torch.Tensor, args: argparse.Namespace, steps: int, seed: int,
          teacher: Any = None) -> dict[str, Any]:
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=args.device.startswith("cuda"))
    model.train()
    t0 = time.perf_counter()
    losses = []
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if args.device.startswith("cuda") else torch.autocast("cpu", enabled=False)
    for step, (x, y) in enumerate(batches(data, args.seq, args.batch, steps, seed, args.device)):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, args.lr, args.warmup)
        with amp:
            logits = model(input_ids=x, use_cache=False).logits.float()
            if teacher is None:
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            else:
                with torch.no_grad():
                    t_logits = teacher(input_ids=x, use_cache=False).logits.float()
                loss = F.kl_div(F.log_softmax(logits, -1), F.log_softmax(t_logits, -1), log_target=True,
                                reduction="batchmean") / x.shape[1]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 250 == 0 or step == steps - 1:
            losses.append([step, round(float(loss.detach()), 4)])
            print(f"  step {step}/{steps} loss {float(loss.detach()):.4f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    model.eval()
    return {"steps": steps, "seconds": round(time.perf_counter() - t0, 1), "losses": losses}


def init_draft(target: Any, layers: int) -> Any:
    import transformers

    cfg = model_config(draft_config(layers=layers))
    torch.manual_seed(1)
    draft = transformers.AutoModelForCausalLM.from_config(cfg).to(next(target.parameters()).device)
    n = target.config.num_hidden_layers
    pick = [round(i * (n - 1) / max(1, layers - 1)) for i in range(layers)] if layers > 1 else [0]
    sd = target.state_dict()
    own = draft.state_dict()
    for k in own:
        src = k
        if ".layers." in k:
            head, rest = k.split(".layers.", 1)
            idx, tail = rest.split(".", 1)
            src = f"{head}.layers.{pick[int(idx)]}.{tail}"
        own[k].copy_(sd[src])
    return draft


def save(model: Any, path: Path) -> None:
    model.to(torch.bfloat16).save_pretrained(str(path), safe_serialization=True)
    model.float()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", required=True, help="GSM8K train JSONL (question, answer)")
    ap.add_argument("--test", help="GSM8K test JSONL, for the acceptance measurement")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--target-steps", type=int, default=5000)
    ap.add_argument("--draft-steps", type=int, default=2500)
    ap.add_argument("--draft-layers", default="2")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--eval-prompts", type=int, default=50)
    ap.add_argument("--eval-tokens", type=int, default=128)
    ap.add_argument("--block", type=int, default=4, help="draft tokens per verify step in the measurement")
    args = ap.parse_args(argv)
    import transformers

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = corpus(load_questions(args.train))
    report: dict[str, Any] = {"command": " ".join(sys.argv), "device": args.device, "corpus_bytes": int(data.numel()),
                              "torch": torch.__version__, "transformers": transformers.__version__, "args": vars(args)}
    if args.device.startswith("cuda"):
        report["gpu"] = torch.cuda.get_device_name()
    t_all = time.perf_counter()
    target = transformers.AutoModelForCausalLM.from_config(model_config(target_config())).to(args.device)
    report["target_params"] = sum(p.numel() for p in target.parameters())
    print(f"target: {report['target_params'] / 1e6:.2f} M parameters, {data.numel()} training bytes", flush=True)
    report["target"] = train(target, data, args, args.target_steps, seed=10)
    save(target, out / "target")
    target.requires_grad_(False)
    report["drafts"] = {}
    for n in [int(x) for x in args.draft_layers.split(",") if x]:
        draft = init_draft(target, n)
        print(f"draft {n} layer(s): {sum(p.numel() for p in draft.parameters()) / 1e6:.2f} M parameters", flush=True)
        rep = train(draft, data, args, args.draft_steps, seed=20 + n, teacher=target)
        rep["params"] = sum(p.numel() for p in draft.parameters())
        save(draft, out / f"draft-{n}l")
        report["drafts"][f"draft-{n}l"] = rep
    report["train_seconds"] = round(time.perf_counter() - t_all, 1)
    (out / "train.json").write_text(json.dumps(report, indent=1))
    if args.test:
        report["acceptance"] = measure(out, args)
    (out / "train.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: report[k] for k in ("train_seconds", "acceptance") if k in report}, indent=1))
    return 0


def measure(out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Greedy block verification with the saved (bf16) weights upcast to float32: per draft, the fraction of
    verify steps whose draft token at position i was accepted (all before it accepted too)."""
    import transformers

    rows = load_questions(args.test, limit=args.eval_prompts)
    tok = ByteTokenizer()
    load = transformers.AutoModelForCausalLM.from_pretrained
    target = load(str(out / "target"), dtype=torch.float32).to(args.device).eval()
    res: dict[str, Any] = {}
    for name in sorted(p.name for p in out.glob("draft-*l")):
        draft = load(str(out / name), dtype=torch.float32).to(args.device).eval()
        reached = [0] * args.block
        steps = 0
        with torch.no_grad():
            for r in rows:
                seq = tok.encode(build_prompt(r["question"]))
                end = len(seq) + args.eval_tokens
                while len(seq) < end:
                    ids = torch.tensor([seq], device=args.device)
                    prop = draft.generate(ids, max_new_tokens=args.block, do_sample=False,
                                          pad_token_id=EOS, eos_token_id=None)[0, len(seq):].tolist()
                    full = torch.tensor([seq + prop], device=args.device)
                    want = target(input_ids=full).logits[0, len(seq) - 1 :].argmax(-1).tolist()
                    acc = 0
                    while acc < len(prop) and prop[acc] == want[acc]:
                        acc += 1
                    for i in range(acc):
                        reached[i] += 1
                    steps += 1
                    seq = seq + prop[:acc] + [want[acc]]
                    if EOS in seq[-(acc + 1):]:
                        break
        res[name] = {"verify_steps": steps, "per_position": [round(x / steps, 4) for x in reached],
                     "mean_accepted": round(sum(reached) / steps, 4)}
        print(name, res[name], flush=True)
    return res


if __name__ == "__main__":
    raise SystemExit(main())
