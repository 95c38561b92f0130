"""The capture points of the SGLang plugin and the SGLang functions they wrap, located by name. Pure data.

A point names one or more *targets* (``module`` + ``qualname``); every target found in the installed
SGLang is wrapped, and a point is active when at least one of its targets was found. Names checked
against sglang 0.5.23 (``models/dflash.py``, ``models/dspark.py``, ``speculative/dflash_worker_v2.py``,
``speculative/dspark_components/``); ``pp_branch`` targets exist only on the branch of SGLang PR #33863
("PP Support PD + DSpark"), whose method names come from the PR description (the branch itself could not
be read here), so they are reported as missing on released SGLang.

What each point records (tensor names in the bundle; see docs/sglang.md for coordinates and shards):

====================  ==========================================================================
``batch``             no tensors: the step / request context every other point uses (always on)
``target.hidden``     ``target.hidden`` per capture layer on the stage that owns it (layer output)
``ctx.project``       ``target.features`` (one per capture layer), ``ctx.pre_norm``, ``ctx.normed``
``ctx.partial``       PR branch: ``target.features`` of the stage, ``ctx.partial`` (partial(stage, of))
``ctx.write``         PR branch: ``ctx.pre_norm`` (the summed projection) entering the last stage's norm
``pp.send``           ``pp.send.<key>`` for tensors handed to the next PP stage (running sums, features)
``draft.kv``          ``draft.k`` / ``draft.v`` per draft layer, read back from the KV pool as written
``draft.kv_steps``    ``draft.k_proj``, ``draft.k_norm``, ``draft.k_rope``, ``draft.v`` (eager path only)
``draft.logits``      ``draft.hidden`` and ``draft.logits`` (this rank's vocabulary shard) per step
``accept``            acceptance.jsonl: proposed tokens and number accepted per verify step
====================  ==========================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["POINTS", "Point", "Target", "point_names"]


@dataclass(frozen=True)
class Target:
    module: str
    qualname: str
    pp_branch: bool = False

    @property
    def path(self) -> str:
        return f"{self.module}.{self.qualname}"


@dataclass(frozen=True)
class Point:
    name: str
    targets: tuple[Target, ...]
    wrapper: str  # name of the factory in probes.engines.sglang.wrappers
    default: bool = True  # selected when VALIDATOR_SGLANG_POINTS is not set


_DFLASH = "sglang.srt.models.dflash"
_DSPARK = "sglang.srt.models.dspark"
_DFLASH_WORKER = "sglang.srt.speculative.dflash_worker_v2"
_DSPARK_WORKER = "sglang.srt.speculative.dspark_components.dspark_worker_v2"
_DSPARK_VERIFY = "sglang.srt.speculative.dspark_components.dspark_verify"

POINTS: tuple[Point, ...] = (
    Point("batch", (
        Target(_DFLASH_WORKER, "DFlashWorkerV2.forward_batch_generation"),
        Target(_DSPARK_WORKER, "DSparkWorkerV2.forward_batch_generation"),
    ), "batch_context"),
    Point("target.hidden", (Target("sglang.srt.model_executor.model_runner", "ModelRunner.load_model"),), "target_layers"),
    Point("ctx.project", (Target(_DFLASH, "DFlashDraftModel.project_target_hidden"),), "project"),
    Point("ctx.partial", (
        Target(_DFLASH, "DFlashDraftModel.project_target_hidden_partial", pp_branch=True),
        Target(_DSPARK, "DSparkDraftMixin.project_target_hidden_partial", pp_branch=True),
    ), "project_partial"),
    Point("ctx.write", (
        Target(_DFLASH, "DFlashDraftModel.write_projected_context_kv", pp_branch=True),
        Target(_DSPARK, "DSparkDraftMixin.write_projected_context_kv", pp_branch=True),
    ), "write_projected"),
    Point("pp.send", (Target("sglang.srt.distributed.parallel_state", "GroupCoordinator.send_tensor_dict"),), "pp_send"),
    Point("draft.kv", (
        Target(_DFLASH_WORKER, "DFlashWorkerV2._append_target_hidden_to_draft_kv_by_loc"),
        Target(_DSPARK, "DSparkDraftMixin.write_target_hidden_kv"),
    ), "kv_readback"),
    Point("draft.kv_steps", (
        Target(_DFLASH, "DFlashAttention.kv_proj_only"),
        Target(_DFLASH, "DFlashAttention.apply_k_norm"),
        Target(_DFLASH, "DFlashAttention.apply_k_rope"),
    ), "kv_steps", default=False),
    Point("draft.logits", (Target(_DFLASH_WORKER, "DFlashWorkerV2._greedy_sample_from_vocab_parallel_head"),),
          "draft_logits"),
    Point("accept", (
        Target(_DFLASH_WORKER, "DFlashWorkerV2._accept_block"),
        Target(_DSPARK_VERIFY, "DsparkVerifyEpilogue._accept"),
    ), "accept"),
)  # fmt: skip

_BY_NAME = {p.name: p for p in POINTS}


def point_names() -> list[str]:
    return [p.name for p in POINTS]


def get_point(name: str) -> Point:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown capture point {name!r}; known: {', '.join(point_names())}") from None
