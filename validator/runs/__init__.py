"""Runs: reading what a user can name as a run (a bundle directory, safetensors files, an SGLang dumper
folder, its ``dims`` layouts and token alignment) into one :class:`RunView`, validated safetensors reading,
reassembly of logical tensors from TP/PP shards, and acceptance records (JSONL in, Parquet stored)."""

from validator._exports import public

__getattr__, __all__ = public(
    __name__,
    {
        "view": ["RunView", "TensorRef"],
        "sources": ["open_path", "read_bundle", "read_safetensors_dir", "read_safetensors_file"],
        "reassembly": ["LogicalTensor", "group_logical", "logical_key"],
        "tensorfile": ["SafetensorsFile", "TensorEntry", "dtype_name", "torch_dtype"],
        "dumper": ["is_dumper_dir", "read_dumper_dir"],
        "dims": ["LayoutError", "parse_dims", "plan_layout"],
        "token_align": ["align_views", "open_for_alignment"],
        "acceptance_records": [
            "AcceptanceInputError",
            "read_acceptance_bundle",
            "read_acceptance_jsonl",
            "read_acceptance_parquet",
            "write_acceptance_jsonl",
            "write_acceptance_parquet",
            "records_to_frame",
        ],
    },
)
