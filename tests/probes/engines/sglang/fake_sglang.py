"""A small stand-in for SGLang's DFlash path, written as an ``sglang`` package into a folder.

SGLang 0.5.23 cannot be imported here (its kernels and server dependencies are not installed), so the
plugin's wrappers are exercised on this package: same module paths, class names and method signatures
as sglang 0.5.23 (``test_fake_matches_real_signatures`` checks them against the real source), CPU
arithmetic in float32, tiny shapes. ``project_target_hidden_partial`` and ``write_projected_context_kv``
follow the description of SGLang PR #33863 (that branch could not be read).

Process groups are faked from environment variables (``FAKE_TP_RANK``, ``FAKE_TP_SIZE``, ``FAKE_PP_RANK``,
``FAKE_PP_SIZE``), read when asked, so one test process can play several ranks in turn.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

HIDDEN, N_LAYERS, CAPTURE, DRAFT_LAYERS, KV_HEADS, HEAD_DIM, VOCAB, BLOCK = 16, 8, (1, 4, 6), 2, 4, 4, 32, 4

FILES: dict[str, str] = {
    "sglang/__init__.py": "from sglang.version import __version__\n",
    "sglang/version.py": "__version__ = '0.5.23+fake'\n",
    "sglang/_version.py": "__version__ = version = '0.5.23+fake'\n",
    "sglang/srt/__init__.py": "",
    "sglang/srt/models/__init__.py": "",
    "sglang/srt/speculative/__init__.py": "",
    "sglang/srt/speculative/dspark_components/__init__.py": "",
    "sglang/srt/model_executor/__init__.py": "",
    "sglang/srt/mem_cache/__init__.py": "",
    "sglang/srt/layers/__init__.py": "",
    "sglang/srt/layers/dp_attention.py": "def is_dp_attention_enabled():\n    return False\n",
    "sglang/srt/distributed/__init__.py": "",
    "sglang/srt/distributed/parallel_state.py": """
        import os


        class GroupCoordinator:
            def __init__(self, name):
                self.unique_name = name
                self.sent = []

            @property
            def rank_in_group(self):
                return int(os.environ.get(f"FAKE_{self.unique_name.upper()}_RANK", "0"))

            @property
            def world_size(self):
                return int(os.environ.get(f"FAKE_{self.unique_name.upper()}_SIZE", "1"))

            @property
            def is_last_rank(self):
                return self.rank_in_group == self.world_size - 1

            def send_tensor_dict(self, tensor_dict, dst=None, all_gather_group=None, async_send=False):
                self.sent.append(dict(tensor_dict))
                return None


        _TP, _PP = GroupCoordinator("tp"), GroupCoordinator("pp")


        def get_tp_group():
            return _TP


        def get_pp_group():
            return _PP
    """,
    "sglang/srt/mem_cache/memory_pool.py": """
        import torch


        class MHATokenToKVPool:
            def __init__(self, size, layer_num, head_num, head_dim, dtype=torch.float32):
                self.k_buffer = [torch.zeros(size, head_num, head_dim, dtype=dtype) for _ in range(layer_num)]
                self.v_buffer = [torch.zeros(size, head_num, head_dim, dtype=dtype) for _ in range(layer_num)]

            def get_key_buffer(self, layer_id):
                return self.k_buffer[layer_id]

            def get_value_buffer(self, layer_id):
                return self.v_buffer[layer_id]

            def set_kv_buffer(self, layer, loc, cache_k, cache_v, k_scale=None, v_scale=None):
                self.k_buffer[layer.layer_id][loc] = cache_k
                self.v_buffer[layer.layer_id][loc] = cache_v
    """,
    "sglang/srt/model_executor/model_runner.py": """
        class ModelRunner:
            def __init__(self, build, is_draft_worker=False, token_to_kv_pool=None):
                self.build = build
                self.is_draft_worker = is_draft_worker
                self.token_to_kv_pool = token_to_kv_pool
                self.model = None

            def load_model(self):
                self.model = self.build()
    """,
    "sglang/srt/models/dflash.py": """
        import torch
        from torch import nn

        from sglang.srt.distributed.parallel_state import get_tp_group


        def _weight(seed, *shape):
            g = torch.Generator().manual_seed(seed)
            return torch.randn(*shape, generator=g) / shape[-1] ** 0.5


        class RMSNorm(nn.Module):
            def __init__(self, size, eps=1e-6):
                super().__init__()
                self.weight = nn.Parameter(1 + 0.1 * _weight(size, size)[0], requires_grad=False)
                self.variance_epsilon = eps

            def forward(self, x):
                v = x.pow(2).mean(-1, keepdim=True)
                return x * torch.rsqrt(v + self.variance_epsilon) * self.weight


        class RadixAttention:
            def __init__(self, layer_id):
                self.layer_id = layer_id
                self.k_scale = self.v_scale = None


        class DFlashAttention(nn.Module):
            def __init__(self, layer_id, hidden_size, total_num_kv_heads, head_dim):
                super().__init__()
                tp = get_tp_group()
                tp_rank, tp_size = tp.rank_in_group, tp.world_size
                self.total_num_kv_heads = total_num_kv_heads
                self.num_kv_heads = max(1, total_num_kv_heads // tp_size)
                self.head_dim = head_dim
                self.kv_size = self.num_kv_heads * head_dim
                reps = tp_size // total_num_kv_heads if tp_size > total_num_kv_heads else 1
                first = (tp_rank // reps) * self.num_kv_heads
                k_all = _weight(100 + layer_id, total_num_kv_heads, head_dim, hidden_size)
                v_all = _weight(200 + layer_id, total_num_kv_heads, head_dim, hidden_size)
                local = slice(first, first + self.num_kv_heads)
                self.kv_weight = torch.cat([k_all[local].reshape(-1, hidden_size), v_all[local].reshape(-1, hidden_size)])
                self.k_norm = RMSNorm(head_dim)
                self.attn = RadixAttention(layer_id)

            def kv_proj_only(self, hidden_states):
                kv = hidden_states @ self.kv_weight.T
                k, v = kv.split([self.kv_size, self.kv_size], dim=-1)
                return k, v

            def apply_k_norm(self, k):
                return self.k_norm(k.reshape(-1, self.head_dim)).view_as(k)

            def apply_k_rope(self, positions, k):
                half = self.head_dim // 2
                kk = k.reshape(k.shape[0], -1, self.head_dim)
                ang = positions.to(torch.float32)[:, None, None] * 0.1
                x1, x2 = kk[..., :half], kk[..., half:]
                out = torch.cat([x1 * torch.cos(ang) - x2 * torch.sin(ang), x2 * torch.cos(ang) + x1 * torch.sin(ang)], -1)
                return out.reshape_as(k)


        class DFlashDecoderLayer(nn.Module):
            def __init__(self, layer_id, hidden_size, total_num_kv_heads, head_dim):
                super().__init__()
                self.self_attn = DFlashAttention(layer_id, hidden_size, total_num_kv_heads, head_dim)


        class _DraftConfig:
            def __init__(self, target_layer_ids):
                self.target_layer_ids = list(target_layer_ids)


        class DFlashDraftModel(nn.Module):
            def __init__(self, hidden_size, target_layer_ids, num_layers, total_num_kv_heads, head_dim):
                super().__init__()
                self.draft_config = _DraftConfig(target_layer_ids)
                self.num_context_features = len(target_layer_ids)
                self.fc = nn.Linear(len(target_layer_ids) * hidden_size, hidden_size, bias=False)
                self.fc.weight.data = _weight(7, hidden_size, len(target_layer_ids) * hidden_size)
                self.hidden_norm = RMSNorm(hidden_size)
                self.layers = nn.ModuleList(
                    DFlashDecoderLayer(i, hidden_size, total_num_kv_heads, head_dim) for i in range(num_layers)
                )

            def project_target_hidden(self, target_hidden):
                return self.hidden_norm(self.fc(target_hidden))

            # PR #33863, from its description: each PP stage projects its own features before the norm
            def project_target_hidden_partial(self, x_local, feature_indices):
                h = self.fc.weight.shape[0]
                cols = torch.cat([torch.arange(i * h, (i + 1) * h) for i in feature_indices])
                return x_local @ self.fc.weight[:, cols].T

            def write_projected_context_kv(self, *, projected_context, pool, positions, cache_loc,
                                           cache_loc_2d=None, commit_lens=None):
                ctx = self.hidden_norm(projected_context)
                for layer in self.layers:
                    attn = layer.self_attn
                    k, v = attn.kv_proj_only(ctx)
                    k = attn.apply_k_rope(positions, attn.apply_k_norm(k))
                    pool.set_kv_buffer(attn.attn, cache_loc, k.view(-1, attn.num_kv_heads, attn.head_dim),
                                       v.view(-1, attn.num_kv_heads, attn.head_dim))
    """,
    "sglang/srt/models/dspark.py": """
        from sglang.srt.models.dflash import DFlashDraftModel


        class DSparkDraftMixin:
            def write_target_hidden_kv(self, *, target_hidden, pool, positions, cache_loc, cache_loc_2d=None,
                                       commit_lens=None, target_hidden_is_projected=False):
                ctx = target_hidden if target_hidden_is_projected else self.project_target_hidden(target_hidden)
                for layer in self.layers:
                    attn = layer.self_attn
                    k, v = attn.kv_proj_only(ctx)
                    k = attn.apply_k_rope(positions, attn.apply_k_norm(k))
                    pool.set_kv_buffer(attn.attn, cache_loc, k.view(-1, attn.num_kv_heads, attn.head_dim),
                                       v.view(-1, attn.num_kv_heads, attn.head_dim))


        class DSparkDraftModel(DSparkDraftMixin, DFlashDraftModel):
            pass
    """,
    "sglang/srt/speculative/dspark_components/dspark_worker_v2.py": """
        class DSparkWorkerV2:
            def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
                raise NotImplementedError
    """,
    "sglang/srt/speculative/dspark_components/dspark_verify.py": """
        class DsparkVerifyEpilogue:
            def _accept(self, *, candidates, logits, draft_tokens, seq_lens, cutoff_verify_lens=None):
                raise NotImplementedError
    """,
    "sglang/srt/speculative/dflash_worker_v2.py": '''
        import torch

        from sglang.srt.distributed.parallel_state import get_pp_group


        class DFlashWorkerV2:
            """Prefill: target forward, draft KV from the captured features. Decode: draft a block, verify,
            accept (a fixed pattern: request i accepts (step + i) % block drafts), write committed draft KV."""

            def __init__(self, target_runner, draft_runner, embed, lm_head, block_size):
                self.target_worker = type("TW", (), {"model_runner": target_runner})()
                self.draft_model_runner = draft_runner
                self.draft_model = draft_runner.model
                self.embed, self.lm_head, self.block_size = embed, lm_head, block_size
                self.slots = {}
                self.next_slot = 0

            def _locs(self, rid, start, n):
                table = self.slots.setdefault(rid, [])
                while len(table) < start + n:
                    table.append(self.next_slot)
                    self.next_slot += 1
                return table[start : start + n]

            def _target(self, ids, pp_proxy_tensors=None):
                model = self.target_worker.model_runner.model
                return model(self.embed[ids], pp_proxy_tensors=pp_proxy_tensors)

            def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
                pp = get_pp_group()
                if batch.forward_mode.is_extend():
                    ids = torch.cat(batch.input_ids)
                    out = self._target(ids, pp_proxy_tensors)
                    positions = torch.cat([torch.arange(p, p + n) for p, n in zip(batch.prefix_lens, batch.extend_lens)])
                    locs = [loc for r, p, n in zip(batch.reqs, batch.prefix_lens, batch.extend_lens) for loc in self._locs(r.rid, p, n)]
                    if pp.world_size > 1:  # PR #33863: partial projections summed stage to stage, norm at the end
                        ids_all = self.draft_model.draft_config.target_layer_ids
                        local = out["local"]
                        if local:
                            x_local = torch.cat([f for _, f in local], -1)
                            partial = self.draft_model.project_target_hidden_partial(x_local, [ids_all.index(l) for l, _ in local])
                        else:
                            partial = torch.zeros(ids.shape[0], self.draft_model.fc.weight.shape[0])
                        acc = partial if pp_proxy_tensors is None else pp_proxy_tensors["dspark_ctx_acc"] + partial
                        if not pp.is_last_rank:
                            proxy = {"hidden_states": out["hidden_states"], "residual": out["residual"], "dspark_ctx_acc": acc}
                            pp.send_tensor_dict(proxy)
                            return proxy
                        self.draft_model.write_projected_context_kv(
                            projected_context=acc, pool=self.draft_model_runner.token_to_kv_pool, positions=positions,
                            cache_loc=torch.tensor(locs))
                        return out["hidden"]
                    self._append_target_hidden_to_draft_kv_by_loc(
                        target_hidden=out["aux"], cache_loc=torch.tensor(locs), positions=positions,
                        extend_lens=torch.tensor(batch.extend_lens, dtype=torch.int32))
                    return out["hidden"]
                bs, block = len(batch.reqs), self.block_size
                prefix = batch.seq_lens_cpu
                bonus = torch.tensor([len(r.rid) % 7 for r in batch.reqs])
                draft_hidden = self.embed[bonus].repeat_interleave(block - 1, 0) * torch.arange(1, block).repeat(bs)[:, None]
                draft_next = self._greedy_sample_from_vocab_parallel_head(hidden_states=draft_hidden, lm_head=self.lm_head)
                candidates = torch.cat([bonus[:, None], draft_next.view(bs, block - 1)], 1)
                out = self._target(candidates.reshape(-1))
                hidden, aux = out["hidden"], out["aux"]
                accept_len, commit_lens, _, _, _ = self._accept_block(
                    candidates=candidates, next_token_logits=hidden, sampling_info=None, draft_input=None,
                    prefix_lens=prefix, bs=bs)
                positions = torch.cat([torch.arange(int(p), int(p) + block) for p in prefix])
                loc2d = torch.tensor([self._locs(r.rid, int(p), block) for r, p in zip(batch.reqs, prefix)])
                self._append_target_hidden_to_draft_kv_by_loc(
                    target_hidden=aux, cache_loc=loc2d.reshape(-1), cache_loc_2d=loc2d, positions=positions,
                    commit_lens=commit_lens)
                return accept_len

            def _greedy_sample_from_vocab_parallel_head(self, *, hidden_states, lm_head, chunk_size=256):
                return torch.argmax(hidden_states @ lm_head.weight.T, dim=-1)

            def _accept_block(self, *, candidates, next_token_logits, sampling_info, draft_input, prefix_lens, bs,
                              target_predict=None):
                step = int(prefix_lens[0]) if len(prefix_lens) else 0
                accept_len = torch.tensor([(step + i) % self.block_size for i in range(bs)], dtype=torch.int32)
                commit_lens = accept_len + 1
                return accept_len, commit_lens, candidates[:, 0], candidates, None

            def _append_target_hidden_to_draft_kv_by_loc(self, *, target_hidden, cache_loc, positions,
                                                         cache_loc_2d=None, commit_lens=None, extend_lens=None):
                ctx_hidden = self.draft_model.project_target_hidden(target_hidden)
                pool = self.draft_model_runner.token_to_kv_pool
                for layer in self.draft_model.layers:
                    attn = layer.self_attn
                    k, v = attn.kv_proj_only(ctx_hidden)
                    k = attn.apply_k_norm(k)
                    k = attn.apply_k_rope(positions, k)
                    k = k.view(-1, attn.num_kv_heads, attn.head_dim)
                    v = v.view(-1, attn.num_kv_heads, attn.head_dim)
                    if cache_loc_2d is not None:
                        bs, width = cache_loc_2d.shape
                        rows = torch.cat([torch.arange(i * width, i * width + int(c)) for i, c in enumerate(commit_lens)])
                        pool.set_kv_buffer(attn.attn, cache_loc_2d.reshape(-1)[rows], k[rows], v[rows])
                    else:
                        pool.set_kv_buffer(attn.attn, cache_loc, k, v)
    ''',
}

# The target model and the "server" loop live outside the fake sglang package (they are the test's).
SERVER = (
    textwrap.dedent(
        '''
    """Drive the fake DFlash worker like a scheduler: one prefill of all requests, then decode steps."""
    import os
    from types import SimpleNamespace

    import torch
    from torch import nn

    H, NL, CAPTURE, DL, KVH, HD, V, BLOCK = {consts}


    class Layer(nn.Module):
        def __init__(self, i):
            super().__init__()
            g = torch.Generator().manual_seed(1000 + i)
            self.w = nn.Parameter(torch.randn(H, H, generator=g) / H**0.5, requires_grad=False)

        def forward(self, positions, hidden_states, forward_batch=None, residual=None):
            x = hidden_states if residual is None else hidden_states + residual
            return torch.tanh(x @ self.w.T), x


    class Inner(nn.Module):
        def __init__(self, start, end):
            super().__init__()
            self.layers = nn.ModuleList(Layer(i) for i in range(NL))
            self.start_layer, self.end_layer = start, end
            self.layers_to_capture = []


    class Target(nn.Module):
        """Layers [start, end) of an NL-layer decoder; aux features = outputs of the capture layers it owns."""

        def __init__(self, start, end, last, buggy):
            super().__init__()
            self.model = Inner(start, end)
            self.last, self.buggy = last, buggy

        def set_dflash_layers_to_capture(self, layer_ids):
            if self.buggy and not self.last:  # the "capture only on the last PP rank" bug
                return
            self.model.layers_to_capture = [v + 1 for v in layer_ids]

        def forward(self, x, pp_proxy_tensors=None):
            m = self.model
            residual, local = None, []
            if pp_proxy_tensors is not None:
                x, residual = pp_proxy_tensors["hidden_states"], pp_proxy_tensors["residual"]
            for i in range(m.start_layer, m.end_layer):
                x, residual = m.layers[i](None, x, None, residual)
                if i + 1 in m.layers_to_capture:
                    local.append((i, x + residual))
            out = {{"hidden_states": x, "residual": residual, "local": local}}
            if self.last:
                out["hidden"] = x + residual
                out["aux"] = torch.cat([f for _, f in local], -1) if local else None
            return out


    def main():
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
        from sglang.srt.model_executor.model_runner import ModelRunner
        from sglang.srt.models.dflash import DFlashDraftModel
        from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

        tp = int(os.environ.get("FAKE_TP_SIZE", "1"))
        g = torch.Generator().manual_seed(5)
        embed = torch.randn(V, H, generator=g)
        lm_head = SimpleNamespace(weight=torch.randn(V, H, generator=g))
        target = ModelRunner(lambda: Target(0, NL, True, False))
        target.load_model()
        target.model.set_dflash_layers_to_capture(list(CAPTURE))
        pool = MHATokenToKVPool(256, DL, max(1, KVH // tp), HD)
        draft = ModelRunner(lambda: DFlashDraftModel(H, CAPTURE, DL, KVH, HD), is_draft_worker=True, token_to_kv_pool=pool)
        draft.load_model()
        worker = DFlashWorkerV2(target, draft, embed, lm_head, BLOCK)
        reqs = [SimpleNamespace(rid="req-a"), SimpleNamespace(rid="req-bb")]
        lens = [5, 3]
        ids = [torch.arange(n) % V for n in lens]
        extend = SimpleNamespace(is_extend=lambda: True)
        decode = SimpleNamespace(is_extend=lambda: False)
        worker.forward_batch_generation(SimpleNamespace(reqs=reqs, forward_mode=extend, input_ids=ids,
                                                        extend_lens=lens, prefix_lens=[0, 0]))
        seq = list(lens)
        for _ in range(int(os.environ.get("FAKE_DECODE_STEPS", "2"))):
            acc = worker.forward_batch_generation(SimpleNamespace(reqs=reqs, forward_mode=decode,
                                                                  seq_lens_cpu=torch.tensor(seq)))
            seq = [s + int(a) + 1 for s, a in zip(seq, acc)]


    if __name__ == "__main__":
        main()
    '''
    )
    .replace("{consts}", repr((HIDDEN, N_LAYERS, CAPTURE, DRAFT_LAYERS, KV_HEADS, HEAD_DIM, VOCAB, BLOCK)))
    .replace("{{", "{")
    .replace("}}", "}")
)


def write_fake_sglang(root: Path) -> Path:
    """Write the fake package (and ``fake_server.py``) under ``root``; returns ``root``."""
    for rel, text in FILES.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).lstrip("\n"))
    (root / "fake_server.py").write_text(SERVER)
    return root
