"""The fused (Triton) summary against NumPy float64, on the CPU under Triton's interpreter.

The kernels run in a subprocess that sets ``TRITON_INTERPRET=1`` before Triton is imported (no opt-in
variable needed from whoever runs the tests); the parent compares what it prints with
``tests.probes.core.test_capture.np_summary``. The same cases run on a CUDA device where there is one
(``test_fused_on_cuda``).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from probes.core.summary import summarize, summarize_many
from tests.probes.core.test_capture import assert_summary
from tests.triton_interpreter import interpreted

FLOATS = [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2]


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _with_nonfinite(t: torch.Tensor) -> torch.Tensor:
    t = t.clone().reshape(-1)
    if t.dtype == torch.float8_e4m3fn:  # no infinities in this format
        t[3] = t[9000 % t.numel()] = math.nan
    else:
        t[3], t[5], t[6] = math.nan, math.inf, -math.inf
    return t


def cases() -> dict[str, torch.Tensor]:
    """Tensors the fused summary must get right: every float dtype, NaN/Inf, empty, views, several
    programs and checksum periods, magnitudes that float32 squares cannot hold."""
    g = torch.Generator().manual_seed(3)
    out: dict[str, torch.Tensor] = {}
    for dt in FLOATS:
        base = torch.randn(257, 96, generator=g) * 3 + 0.5
        out[f"plain-{_name(dt)}"] = base.to(dt)
        out[f"nonfinite-{_name(dt)}"] = _with_nonfinite(base.to(dt))
        # several programs and more than one checksum period (65536 words)
        out[f"long-{_name(dt)}"] = (torch.randn(70_001, generator=g) * 2).to(dt)
        out[f"transposed-{_name(dt)}"] = base.to(dt).t()
        out[f"strided-{_name(dt)}"] = base.to(dt)[1::3, ::2]
        out[f"empty-{_name(dt)}"] = torch.empty(0, 5, dtype=dt)
        out[f"one-{_name(dt)}"] = torch.tensor([-1.5]).to(dt)
    x = torch.randn(40_000, generator=g)
    out["tiny-float32"] = x * 1e-30  # squares underflow float32: the program sums in float64
    out["subnormal-float32"] = x * 1e-41
    out["huge-bfloat16"] = (x * 1e30).to(torch.bfloat16)  # squares overflow float32
    out["huge-float64"] = x.double() * 1e200  # squares overflow float64 too: inf, like NumPy
    out["mixed-scale-float32"] = torch.cat([x[:20000] * 1e-30, x[20000:]])
    out["zeros-bfloat16"] = torch.zeros(5000, dtype=torch.bfloat16)
    out["all-nan-float16"] = torch.full((3000,), math.nan, dtype=torch.float16)
    out["plus-minus-inf-float32"] = torch.tensor([math.inf, -math.inf, 1.0])
    out["scalar-float32"] = torch.tensor(2.5)
    out["offset-bfloat16"] = (torch.randn(5001, generator=g) * 3).to(torch.bfloat16)[1:]  # not 16-byte aligned
    out["offset-float32"] = torch.randn(30_001, generator=g)[1:]
    out["whole-chunks-bfloat16"] = (torch.randn(24 * 1024, generator=g) * 5).to(torch.bfloat16)  # no partial chunk
    return out


def _interpreter_main() -> None:
    """Run in a subprocess with TRITON_INTERPRET=1: the fused summary of every case, as JSON lines."""
    import warnings

    warnings.simplefilter("ignore")  # the interpreter's NumPy arithmetic warns on inf - inf, 0 / 0
    all_cases = cases()
    rows = torch.zeros(len(all_cases) + 1, 5, dtype=torch.float64)  # all at once, in rows 1.. backwards
    summarize_many(list(all_cases.values()), out=rows, rows=list(range(len(all_cases), 0, -1)), backend="fused")
    for i, (name, t) in enumerate(all_cases.items()):
        alone = summarize(t, backend="fused")
        print(
            json.dumps(
                {
                    "case": name,
                    "summary": alone.tolist(),
                    "bits": alone.view(torch.int64).tolist(),
                    "many_bits": rows[len(all_cases) - i].view(torch.int64).tolist(),
                }
            )
        )


def test_fused_summary_in_interpreter_matches_numpy() -> None:
    pytest.importorskip("triton")
    lines = interpreted("from tests.probes.core.test_fused_summary import _interpreter_main; _interpreter_main()")
    got = {r["case"]: r["summary"] for r in lines}
    want = cases()
    assert set(got) == set(want)
    for r in lines:  # summarize_many gives each tensor the bits it gets alone
        assert r["many_bits"] == r["bits"], r["case"]
    for name, t in want.items():
        check(torch.tensor(got[name], dtype=torch.float64), t, name)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same float64 bits, a NaN matching any NaN (its sign and payload depend on which NaN an
    addition met first, which is not part of the summary's definition)."""
    nan = a.isnan()
    return torch.equal(nan, b.isnan()) and torch.equal(
        a.masked_fill(nan, 0).view(torch.int64), b.masked_fill(nan, 0).view(torch.int64)
    )


def check(got: torch.Tensor, t: torch.Tensor, name: str) -> None:
    if t.numel() == 0:
        assert got[[0, 1, 3, 4]].tolist() == [0, 0, 0, 0] and math.isnan(got[2].item()), name
        return
    try:
        assert_summary(got, t, rtol=1e-6)
    except AssertionError as exc:
        raise AssertionError(f"{name}: {exc}") from None


def test_torch_and_fused_agree_on_backend_choice() -> None:
    # on the CPU, "auto" is the float64 torch path; "torch" is always available
    t = torch.randn(100).to(torch.bfloat16)
    assert summarize(t).tolist() == summarize(t, backend="torch").tolist()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_on_cuda() -> None:
    pytest.importorskip("triton")
    on_device = {name: t.cuda() for name, t in cases().items()}
    rows = summarize_many(
        list(on_device.values()), out=torch.zeros(len(on_device), 5, dtype=torch.float64, device="cuda")
    )
    for i, (name, t) in enumerate(on_device.items()):
        got = summarize(t)
        check(got.cpu(), t.cpu(), name)
        again = summarize(t)
        assert torch.equal(got.view(torch.int64), again.view(torch.int64)), name  # same bits every call
        assert same_bits(got, rows[i]), name  # alone or among many
