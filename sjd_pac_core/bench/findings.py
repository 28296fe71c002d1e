"""The questions the benchmark answers, from its runs and summary: the auto window against the
best fixed L, the two verification rules side by side, seed-exact agreement under gumbel, and the
project's targets."""

from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, Optional, Sequence

from .methods import MethodSpec, method_label, parse_method
from .summary import RunRecord, quantiles


def _spec(key: str) -> Optional[MethodSpec]:
    try:
        return parse_method(key)
    except ValueError:
        return None


def _best(summary: Dict[str, dict], variant: str, field: str, like: Optional[MethodSpec] = None) -> Optional[str]:
    """The fixed-window row of `variant` with the largest `field` (same rule, compilation and tree
    knobs as `like` when given)."""
    keys = []
    for k in summary:
        spec = _spec(k)
        if spec is None or spec.variant != variant or spec.window in (None, "auto"):
            continue
        if like is not None and (spec.verify, spec.compiled, spec.tree_text) != (like.verify, like.compiled,
                                                                                   like.tree_text):
            continue
        if summary[k].get(field) is not None:
            keys.append(k)
    return max(keys, key=lambda k: summary[k][field], default=None)


def _paired(runs: Sequence[RunRecord], numerator: str, denominator: str) -> List[float]:
    """latency(numerator) / latency(denominator) per (prompt, seed) both ran."""
    lat = {(r.method, r.prompt_index, r.seed): r.latency_s for r in runs}
    return [lat[(numerator, p, s)] / lat[(m, p, s)] for (m, p, s) in lat
            if m == denominator and (numerator, p, s) in lat]


def rule_comparison(runs: Sequence[RunRecord], summary: Dict[str, dict]) -> List[dict]:
    """Every windowed (variant, window, compiled) row run under both rules: step compression of each and the
    paired latency ratio rejection / gumbel (> 1: gumbel faster)."""
    rows = []
    for key in summary:
        spec = _spec(key)
        if spec is None or spec.verify != "gumbel" or spec.is_ar:  # AR rows compress nothing
            continue
        twin = replace(spec, verify="rejection").key
        if twin not in summary:
            continue
        ratios = _paired(runs, twin, key)
        q = quantiles(ratios) if ratios else {"median": None, "q25": None, "q75": None}
        rows.append({
            "method": replace(spec, verify=None).key,
            "compression_rejection": summary[twin]["step_compression"],
            "compression_gumbel": summary[key]["step_compression"],
            "compression_gain": summary[key]["step_compression"] / summary[twin]["step_compression"],
            "speedup_rejection": summary[twin].get("speedup_median"),
            "speedup_gumbel": summary[key].get("speedup_median"),
            "latency_rejection_over_gumbel_median": q["median"], "q25": q["q25"], "q75": q["q75"],
        })
    return rows


def seed_exact_agreement(runs: Sequence[RunRecord], base_verify: Optional[str] = None) -> Dict[str, dict]:
    """Under verify='gumbel' every method (transformers' generate with our processor included)
    must return plain AR's tokens for the same seed: identical (prompt, seed) pairs per row,
    against our eager AR under gumbel."""
    def rule(key: str) -> Optional[str]:
        spec = _spec(key)
        return None if spec is None else (spec.verify or base_verify)

    ar_keys = [k for k in {r.method for r in runs} if (_spec(k) or MethodSpec("sjd", 1)).variant == "ar"
               and rule(k) == "gumbel"]
    if not ar_keys:
        return {}
    reference = min(ar_keys, key=lambda k: (_spec(k).compiled, k))  # eager first
    digest = {(r.prompt_index, r.seed): r.token_digest for r in runs if r.method == reference}
    out: Dict[str, dict] = {}
    for key in sorted({r.method for r in runs}):
        if key == reference or rule(key) != "gumbel":
            continue
        pairs = [(r.prompt_index, r.seed) for r in runs if r.method == key and (r.prompt_index, r.seed) in digest]
        same = sum(1 for r in runs if r.method == key and digest.get((r.prompt_index, r.seed)) == r.token_digest)
        out[key] = {"against": reference, "pairs": len(pairs), "identical": same}
    return out


def findings(runs: Sequence[RunRecord], summary: Dict[str, dict],
             base_verify: Optional[str] = None) -> Dict[str, object]:
    """Auto window vs the best fixed L (paired per prompt and seed), the two rules side by side,
    seed-exact agreement under gumbel, and the project's targets."""
    out: Dict[str, object] = {}
    autos = [k for k in summary if "@auto" in k]
    comparisons = []
    for auto in autos:  # each auto row against the best fixed L of its own variant, rule and compilation
        spec = _spec(auto)
        best_fixed = _best(summary, spec.variant, "speedup_median", like=spec) if spec else None
        if not best_fixed:
            continue
        q = quantiles(_paired(runs, best_fixed, auto))
        comparisons.append({
            "auto": auto, "best_fixed": best_fixed,
            "auto_speedup_over_ar": summary[auto].get("speedup_median"),
            "best_fixed_speedup_over_ar": summary[best_fixed].get("speedup_median"),
            "auto_over_best_fixed_median": q["median"], "q25": q["q25"], "q75": q["q75"],
            "auto_slower_than_ar_fraction": summary[auto].get("slower_than_ar_fraction"),
            "auto_median_window": summary[auto]["window_median"],
        })
    if comparisons:
        out["auto_vs_best_fixed"] = comparisons
    auto = next((k for k in autos if (_spec(k) or MethodSpec("sjd", 1)).variant == "sjd-pac"),
                autos[0] if autos else None)
    rules = rule_comparison(runs, summary)
    if rules:
        out["rules"] = rules
    agreement = seed_exact_agreement(runs, base_verify)
    if agreement:
        out["seed_exact"] = agreement
    out["speedup_reference"] = next((row.get("speedup_reference") for row in summary.values()), None)
    pac = _best(summary, "sjd-pac", "step_compression")
    sjd = _best(summary, "sjd", "step_compression")
    targets = {}
    if pac:
        targets["sjd_pac_compression_vs_ar"] = {"value": summary[pac]["step_compression"], "target": 3.5,
                                                "method": pac}
    if pac and sjd:
        targets["sjd_pac_compression_vs_sjd"] = {
            "value": summary[pac]["step_compression"] / summary[sjd]["step_compression"], "target": 2.0,
            "method": f"{pac} / {sjd}"}
    if auto and summary[auto].get("speedup_median") is not None:
        targets["auto_latency_speedup_vs_ar"] = {"value": summary[auto]["speedup_median"], "target": 1.5,
                                                 "method": auto}
    at64 = next((k for k in ("sjd-pac@64", "sjd-pac@64:rejection", "sjd-pac@64:gumbel") if k in summary), None)
    if (pac or at64) and summary[at64 or pac].get("overhead_pct_of_forward") is not None:
        key = at64 or pac
        targets["overhead_pct_of_forward"] = {"value": summary[key]["overhead_pct_of_forward"], "target": 10.0,
                                              "method": key, "lower_is_better": True}
    for t in targets.values():
        t["met"] = t["value"] <= t["target"] if t.get("lower_is_better") else t["value"] >= t["target"]
    out["targets"] = targets
    return out


def findings_markdown(found: Dict[str, object]) -> str:
    lines = []
    for a in found.get("auto_vs_best_fixed", []):
        lines.append(
            f"window='auto', {method_label(a['auto'])}: {a['auto_speedup_over_ar']:.2f}x over AR (median L "
            f"{a['auto_median_window']:g}) vs the best fixed L of the same method, {method_label(a['best_fixed'])}: "
            f"{a['best_fixed_speedup_over_ar']:.2f}x; paired per prompt, "
            f"auto / best fixed latency ratio median {a['auto_over_best_fixed_median']:.2f} "
            f"[IQR {a['q25']:.2f}-{a['q75']:.2f}] (> 1 = auto faster); auto slower than AR on "
            f"{100 * (a['auto_slower_than_ar_fraction'] or 0):.0f}% of prompts.")
    if found.get("speedup_reference"):
        lines.append(f"every latency speedup is paired per (prompt, seed) against the fastest plain-AR row of this "
                     f"run: {method_label(found['speedup_reference'])}.")
    for r in found.get("rules", []):
        ratio = r["latency_rejection_over_gumbel_median"]
        lines.append(
            f"{method_label(r['method'])}: step compression {r['compression_rejection']:.2f}x (rejection) vs "
            f"{r['compression_gumbel']:.2f}x (gumbel), x{r['compression_gain']:.2f}; latency rejection / gumbel "
            + ("-" if ratio is None else f"median {ratio:.2f} [IQR {r['q25']:.2f}-{r['q75']:.2f}]")
            + (" (gumbel faster)" if ratio and ratio > 1 else " (rejection faster)" if ratio else ""))
    for key, a in found.get("seed_exact", {}).items():
        lines.append(f"seed-exact (verify='gumbel'): {method_label(key)} returned {method_label(a['against'])}'s tokens on "
                     f"{a['identical']} of {a['pairs']} (prompt, seed) pairs"
                     + ("" if a["identical"] == a["pairs"] else " - NOT token-identical, see docs/benchmark.md"))
    names = {"sjd_pac_compression_vs_ar": "SJD-PAC step compression over AR (best L)",
             "sjd_pac_compression_vs_sjd": "SJD-PAC step compression over plain SJD (best L of each)",
             "auto_latency_speedup_vs_ar": "latency speedup over AR with window='auto'",
             "overhead_pct_of_forward": "sampler overhead, % of forward time (SJD-PAC L=64)"}
    for key, t in found.get("targets", {}).items():
        cmp = "<=" if t.get("lower_is_better") else ">="
        lines.append(f"target: {names.get(key, key)} {cmp} {t['target']:g}: measured {t['value']:.2f} "
                     f"({t['method']}) - {'met' if t['met'] else 'MISSED'}")
    return "\n".join(f"- {x}" for x in lines)
