# Copyright 2026 treetune-verl contributors
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Benchmark of the math reward: grader throughput and what math-verify adds over the string rule.

Usage::

    python -m treetune_scripts.bench_math_reward [--repeats 20] [--threads 4]

Reads the hand-labelled responses in ``treetune_tests/fixtures/reward_cases.jsonl`` and prints two tables:

1. throughput (answers/s) of ``compute_score`` on all cases, repeated: string rule only; full grader in the main
   thread (math-verify in-process, ``SIGALRM`` limit); full grader from a pool of worker threads as verl's reward
   loop calls it (math-verify in helper processes). The first pass is reported separately (cold caches, helper
   start-up); the repeated passes hit math-verify's parse caches, so they are an upper bound.
2. agreement on the math-route cases: pairs judged equal by math-verify but not by the normalised string rule, and
   the reverse, plus each rule's agreement with the hand labels.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from treetune_verl.utils.reward_score.answer_extraction import extract_math_answer, unbox_ground_truth
from treetune_verl.utils.reward_score.math_answer import ROUTE_MULTIPLE_CHOICE, compute_score, resolve_route
from treetune_verl.utils.reward_score.math_verify_guard import math_verify_equivalent
from treetune_verl.utils.reward_score.string_normalize import strings_equivalent

CASES_PATH = Path(__file__).resolve().parents[1] / "treetune_tests" / "fixtures" / "reward_cases.jsonl"


def _score(case: dict, **kwargs) -> dict:
    extra_info = {"question": case.get("question")}
    return compute_score(case["data_source"], case["response"], case["ground_truth"], extra_info, **kwargs)


def _timed_passes(cases: list[dict], repeats: int, run_pass) -> tuple[float, float]:
    """(answers/s of the first pass, answers/s of the remaining passes)."""
    started = time.perf_counter()
    run_pass(cases)
    first = len(cases) / (time.perf_counter() - started)
    started = time.perf_counter()
    for _ in range(repeats - 1):
        run_pass(cases)
    rest = len(cases) * (repeats - 1) / (time.perf_counter() - started)
    return first, rest


def throughput_table(cases: list[dict], repeats: int, threads: int) -> list[tuple[str, float, float]]:
    def string_only(batch):
        for case in batch:
            _score(case, use_math_verify=False)

    def main_thread(batch):
        for case in batch:
            _score(case)

    pool = ThreadPoolExecutor(max_workers=threads)

    def worker_threads(batch):
        list(pool.map(_score, batch))

    rows = [
        ("string rule only (main thread)", *_timed_passes(cases, repeats, string_only)),
        ("full grader, main thread (in-process)", *_timed_passes(cases, repeats, main_thread)),
        (f"full grader, {threads} worker threads (helpers)", *_timed_passes(cases, repeats, worker_threads)),
    ]
    pool.shutdown()
    return rows


def agreement_table(cases: list[dict], timeout_s: float) -> dict[str, int]:
    counts = dict.fromkeys(
        ("pairs", "both_equal", "math_verify_only", "string_only", "neither", "string_correct", "mv_correct"), 0
    )
    counts["combined_correct"] = 0
    for case in cases:
        if resolve_route(case["data_source"])[0] == ROUTE_MULTIPLE_CHOICE:
            continue
        prediction = extract_math_answer(case["response"]).text
        gold = unbox_ground_truth(str(case["ground_truth"]))
        string_equal = bool(prediction) and strings_equivalent(prediction, gold)
        mv_equal = bool(prediction) and math_verify_equivalent(prediction, gold, timeout_s).equal
        counts["pairs"] += 1
        key = {(True, True): "both_equal", (False, True): "math_verify_only", (True, False): "string_only"}
        counts[key.get((string_equal, mv_equal), "neither")] += 1
        if string_equal != mv_equal:
            print(f"{'string only' if string_equal else 'math-verify only'}: {prediction!r} vs {gold!r}")
        counts["string_correct"] += string_equal == case["expected_acc"]
        counts["mv_correct"] += mv_equal == case["expected_acc"]
        counts["combined_correct"] += (string_equal or mv_equal) == case["expected_acc"]
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20, help="passes over the cases (first one reported apart)")
    parser.add_argument("--threads", type=int, default=4, help="worker threads for the threaded measurement")
    parser.add_argument("--timeout-s", type=float, default=3.0, help="math-verify time limit per call")
    args = parser.parse_args(argv)
    cases = [json.loads(line) for line in CASES_PATH.read_text(encoding="utf-8").splitlines() if line.strip()]

    rows = throughput_table(cases, max(args.repeats, 2), args.threads)
    counts = agreement_table(cases, args.timeout_s)

    print(f"cases: {len(cases)} hand-labelled responses ({CASES_PATH.name}), {args.repeats} passes\n")
    print("| grader | first pass (answers/s) | repeated passes (answers/s) |")
    print("|---|---:|---:|")
    for name, first, rest in rows:
        print(f"| {name} | {first:,.0f} | {rest:,.0f} |")
    print(f"\nagreement on {counts['pairs']} math-route pairs (extracted answer vs ground truth):\n")
    print("| verdict | pairs |")
    print("|---|---:|")
    print(f"| equal by both rules | {counts['both_equal']} |")
    print(f"| equal by math-verify only (string rule misses) | {counts['math_verify_only']} |")
    print(f"| equal by string rule only (math-verify misses) | {counts['string_only']} |")
    print(f"| equal by neither | {counts['neither']} |")
    labels = (("string rule", "string_correct"), ("math-verify", "mv_correct"), ("either (grader)", "combined_correct"))
    for label, key in labels:
        print(f"| agrees with hand label: {label} | {counts[key]} / {counts['pairs']} |")


if __name__ == "__main__":
    main()
