"""Judging: pairing two runs' tensors, the policy and its floors, the verdict, the comparison document and
its renderings (table, Markdown, JUnit), and the acceptance statistics (:mod:`.acceptance`)."""

from validator._exports import public

__getattr__, __all__ = public(
    __name__,
    {
        "compare": ["Comparison", "PairResult", "compare_runs", "merge_verdicts"],
        "exit_codes": ["VERDICT_EXIT", "EXIT_INPUT_ERROR"],
        "holm": ["holm_adjust"],
        "policy": ["Policy", "Rule", "Decision", "Floor", "default_rel_l2", "FLOOR_MULTIPLE", "JUDGING_VERSION"],
        "report": ["comparison_doc", "comparison_json", "format_comparison", "markdown_summary", "write_junit"],
        "text": ["headline", "counts_line", "fmt_num", "format_rows"],
        "engine_metrics": ["compare_engine_metrics"],
        "acceptance": ["AcceptanceComparison", "compare_acceptance"],
    },
)
