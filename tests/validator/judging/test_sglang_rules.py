"""SGLang comparator ``--diff-threshold`` rules imported as policy rules (validator/judging/sglang_rules.py).

Equivalence is checked against SGLang 0.5.23's own rule code (``threshold_dsl.py``, which needs only the standard
library, loaded from the copy scripts/setup unpacks): for every rule set, every tensor name and metric values at,
just below and just above each bound, the imported policy passes a pair exactly when SGLang's predicate holds.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import tomllib
from dataclasses import replace
from types import ModuleType

import pytest
import torch

from tests.paths import ROOT
from validator.errors import InputError
from validator.judging.policy import Policy
from validator.judging.sglang_rules import parse_sglang_rules, policy_doc, policy_toml
from validator.numerics.metrics import TensorMetrics, compare_tensors

DSL = ROOT / ".venv" / "sglang-versions" / "0.5.23" / "sglang" / "srt" / "debug_utils" / "comparator" / "threshold_dsl.py"

# Rule sets as users write them: the comparator's own --help example, its float shorthand, its default (no rules),
# and strict bounds, chains, parentheses and a regex with no glob form.
RULE_SETS = [
    [".*expert.*", "rel <= 0.0085 or max_abs <= 1e-3", ".*", "rel <= 0.0085"],
    ["0.0085"],
    [],
    ["layers\\.[0-9]+\\.mlp.*", "rel < 1e-3 and mean_abs <= 1e-4 and (max_abs <= 0.1 or rel <= 1e-5)",
     "hidden|logits", "0 <= rel <= 2e-3", ".*", "1e-3 > rel and max_abs < 0.5"],
    ["attn_.*", "mean_abs <= 0.01 or mean_abs <= 0.02 or rel == 0", ".*", "rel >= 0 and max_abs <= 1"],
]
NAMES = ["moe.expert.w1", "layers.3.mlp_up", "layers.x.mlp_up", "hidden", "logits", "attn_q", "other"]


@pytest.fixture(scope="module")
def dsl() -> ModuleType:
    if not DSL.exists():
        pytest.skip(f"sglang 0.5.23 is not unpacked at {DSL.parents[4]} (scripts/setup installs it)")
    spec = importlib.util.spec_from_file_location("sglang_threshold_dsl", DSL)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _metrics() -> TensorMetrics:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(64, generator=g, dtype=torch.float64)
    return compare_tensors(a, a + 1e-3 * torch.randn(64, generator=g, dtype=torch.float64))


def _values(rules: list[str], key: str) -> list[float]:
    """Every bound the rules set on ``key``, with the floats on either side of it (also of a strict bound's c:
    'x < c' is stored as x <= the float below c), and a few others. No NaN: validator's metrics are over the
    elements finite in both runs, and NaN in a tensor is the rule's ``nonfinite`` setting."""
    out = {0.0, 1e-9, 0.3, 5.0}
    for r in parse_sglang_rules(rules):
        for alt in r.alternatives:
            for k, bound in alt:
                if k == key:
                    for v in (bound, math.nextafter(bound, math.inf)):
                        out |= {v, math.nextafter(v, math.inf), math.nextafter(v, -math.inf)}
    return sorted(v for v in out if v >= 0)


@pytest.mark.parametrize("rules", RULE_SETS, ids=lambda r: " ".join(r) or "default")
def test_the_imported_policy_passes_exactly_what_sglang_passes(dsl: ModuleType, rules: list[str]) -> None:
    theirs = dsl.parse_diff_threshold_rules(rules or None, default_predicate="rel <= 0.001")
    policy = Policy.from_dict(tomllib.loads(policy_toml(parse_sglang_rules(rules))), source="imported")
    base = _metrics()
    grid = [_values(rules, k) for k in ("rel_diff_max", "max_abs_max", "mean_abs_max")]
    checked = 0
    for name in NAMES:
        predicate = dsl.resolve_predicate(name, theirs, default_predicate="rel <= 0.001")
        code = dsl.parse_predicate(predicate)
        assert policy.rule_for(name) is not None, name  # every rule set here ends in a catch-all
        for rel, max_abs, mean_abs in itertools.product(*grid):
            m = replace(base, rel_diff=rel, max_abs=max_abs, mean_abs=mean_abs)
            want = dsl.evaluate_predicate(code, rel=rel, max_abs=max_abs, mean_abs=mean_abs)
            got = policy.decide(name, m, None, have_floor=False).status
            assert got == ("pass" if want else "fail"), (name, predicate, rel, max_abs, mean_abs, got)
            checked += 1
    assert checked >= 7 * 4 * 4 * 4


def test_rule_strings_become_readable_rules() -> None:
    doc = policy_doc(parse_sglang_rules(RULE_SETS[0]))
    assert doc == {"rule": [
        {"match": "*expert*", "any_of": [{"rel_diff_max": 0.0085}, {"max_abs_max": 0.001}]},
        {"match": "*", "rel_diff_max": 0.0085},
    ]}
    assert policy_doc(parse_sglang_rules(["0.0085"])) == {"rule": [{"match": "*", "rel_diff_max": 0.0085}]}
    assert policy_doc(parse_sglang_rules([])) == {"rule": [{"match": "*", "rel_diff_max": 0.001}]}
    rules = policy_doc(parse_sglang_rules(RULE_SETS[3]))["rule"]
    assert isinstance(rules, list)
    assert rules[0]["regex"] == "layers\\.[0-9]+\\.mlp.*"  # no glob says [0-9]+: kept as a regex
    assert rules[0]["any_of"] == [  # the predicate as alternatives, 'rel < 1e-3' as <= the float below it
        {"max_abs_max": 0.1, "mean_abs_max": 1e-4, "rel_diff_max": math.nextafter(1e-3, 0)},
        {"mean_abs_max": 1e-4, "rel_diff_max": 1e-5},
    ]
    assert rules[1] == {"regex": "hidden|logits", "rel_diff_max": 0.002}  # 0 <= rel always holds
    # 'or' of bounds on one metric keeps the loosest; an always-true part leaves the rule without bounds
    assert policy_doc(parse_sglang_rules(["a", "rel <= 1e-3 or rel <= 1e-2", "b", "rel >= 0"]))["rule"] == [
        {"match": "a", "rel_diff_max": 0.01}, {"match": "b"}]


def test_a_regex_becomes_a_glob_only_when_it_means_the_same() -> None:
    globs = {".*": "*", "model\\.layers\\..*\\.mlp": "model.layers.*.mlp", "x.y": "x?y", "w\\[0\\]": "w[[]0]"}
    for regex, glob in globs.items():
        assert parse_sglang_rules([regex, "rel <= 1"])[0].policy_rule()["match"] == glob
    for regex in ("a|b", "x+", "^x$", "[ab]", "(x)", "a?"):
        assert parse_sglang_rules([regex, "rel <= 1"])[0].policy_rule()["regex"] == regex


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["abc"], "one argument must be a float"),
        ([".*", "rel <= 1e-3", "x"], "odd number of arguments (3)"),
        (["(", "rel <= 1e-3"], "rule 1 ('(' 'rel <= 1e-3'): the regex does not compile"),
        ([".*", "rel <="], "not a predicate"),
        ([".*", "rel >= 1e-3"], "lower bound on a difference"),
        ([".*", "cos <= 1"], "unknown name 'cos'"),
        ([".*", "rel * 2 <= 1e-3"], "neither rel, max_abs, mean_abs nor a finite number"),
        ([".*", "not rel <= 1e-3"], "is not a comparison"),
        ([".*", "rel <= max_abs"], "must compare one of rel, max_abs, mean_abs with a number"),
        ([".*", "rel != 0"], "only <, <=, >, >= (and == 0)"),
        ([".*", "rel < 0"], "never true"),
        ([".*", "rel <= 1e999"], "finite number"),
        ([".*", "rel <= 1" + "0" * 400], "finite number"),
        (["x", "rel <= 1", ".*", "__import__('os')"], "rule 2 "),
    ],
)
def test_rules_that_have_no_policy_form_are_refused(args: list[str], problem: str) -> None:
    with pytest.raises(InputError) as err:
        parse_sglang_rules(args)
    assert problem in str(err.value)


@pytest.mark.parametrize(
    ("rule", "problem"),
    [
        ({"match": "x", "regex": "x"}, "match (a glob) or regex, not both"),
        ({"regex": "("}, "does not compile"),
        ({"any_of": []}, "non-empty list"),
        ({"any_of": [{"rel_l2_max": 1}]}, "unknown key(s) ['rel_l2_max']"),
        ({"any_of": [{"max_abs_max": -1}]}, "non-negative number"),
        ({"rel_diff_max": "1e-3"}, "non-negative number"),
    ],
)
def test_policy_files_with_bad_new_keys_are_refused(rule: dict[str, object], problem: str) -> None:
    with pytest.raises(InputError) as err:
        Policy.from_dict({"rule": [rule]}, source="p.toml")
    assert problem in str(err.value)


def test_point_bounds_and_alternatives_say_why_a_pair_fails() -> None:
    policy = Policy.from_dict({"rule": [{"regex": "e.*", "any_of": [{"rel_diff_max": 1e-9}, {"max_abs_max": 1e-9}]},
                                        {"match": "*", "mean_abs_max": 1e-9, "rel_diff_max": 1.0}]})
    m = _metrics()
    d = policy.decide("expert", m, None, have_floor=False)
    assert d.status == "fail" and d.reasons[0].startswith("none of any_of holds: rel_diff ") and " max_abs " in d.reasons[0]
    d = policy.decide("x", m, None, have_floor=False)
    assert d.status == "fail" and d.reasons == (f"mean_abs {m.mean_abs:.3g} > 1e-09",)
