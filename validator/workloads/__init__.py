"""Workloads that produce or explain runs: the demo, the projection probe's report, the GSM8K workload,
Prometheus scraping of engine counters, the reference speculative-decoding harness, and the P->D
draft-KV transfer layout check."""

from validator._exports import public

__getattr__, __all__ = public(
    __name__,
    {
        "demo": ["run_demo"],
        "projection_report": ["ProjectionReport", "run_projection_report", "format_table"],
        "gsm8k": ["run_gsm8k", "compare_gsm8k", "load_gsm8k_rows"],
        "scrape": ["scrape_window", "write_metrics_bundle"],
        "kv_transfer_plan": ["KVLayout", "transfer_plan", "check_plan", "check_compatible"],
        "harness": ["Harness", "HarnessConfig"],
    },
)
