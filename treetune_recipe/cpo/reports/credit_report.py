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
"""Token-credit report: one self-contained HTML page from a CPO run's ``cpo.credit_dump`` files.

For a few responses per dumped step (``--per-kind`` of each kind: correct / wrong in mixed groups, all-wrong and
all-correct groups) the page shows the prompt, the hint prompt, the reward and every response token coloured by
``δ = teacher_log_probs − old_log_probs`` or, switchable, by the advantage change of the run's wrapper (blue > 0, red
< 0, white 0); hovering a token shows its exact values. A distribution-level method's dump (OPSD, SDPO) has no shaped
advantage: its second colouring is the method's per-token loss, the hover adds the teacher's most likely ids, and each
row says whether it had a teacher context. No server, no network: inline CSS and a few lines of JS (without
JS the page still shows the δ colours and the hover values). Works on any run's dump, CPU or GPU.

The renderer of the recipe's credit dump (``reports.credit_dump``); its command line is
``python -m treetune_scripts.credit_report <run>/credit_dump report.html [--per-kind 2]``.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from treetune_recipe.cpo.reports.credit_dump import ROW_KINDS

_STYLE = """
body { font-family: sans-serif; margin: 1.5em; max-width: 1100px; }
.resp { border: 1px solid #ccc; border-radius: 6px; padding: 0.6em; margin: 0.8em 0; }
.prompt { white-space: pre-wrap; font-family: monospace; font-size: 12px; background: #f6f6f6; padding: 0.4em; }
.tokens { font-family: monospace; font-size: 14px; line-height: 1.9; white-space: pre-wrap; }
.tok { padding: 1px 0; border-bottom: 1px solid #ddd; }
.meta { color: #333; font-size: 13px; }
.legend span { display: inline-block; width: 2.5em; text-align: center; font-size: 12px; }
"""

_SCRIPT = """
function colour(v, scale) {
  const x = Math.max(-1, Math.min(1, v / scale));
  const a = Math.abs(x).toFixed(3);
  return x >= 0 ? `rgba(30,100,255,${a})` : `rgba(230,40,40,${a})`;
}
function paint(mode) {
  document.querySelectorAll('.tokens').forEach(function (box) {
    const scale = parseFloat(box.dataset[mode + 'Scale']) || 1;
    box.querySelectorAll('.tok').forEach(function (t) {
      t.style.background = colour(parseFloat(t.dataset[mode]), scale);
    });
  });
  document.getElementById('mode').textContent = mode === 'delta' ? 'δ = g − o' : 'advantage change or token loss';
  document.getElementById('m-' + mode).checked = true;
}
// report.html#adv opens with the advantage-change colouring.
window.addEventListener('DOMContentLoaded', function () { if (location.hash === '#adv') paint('adv'); });
"""


def load_dumps(dump_dir: Path | str) -> list[dict]:
    """Every ``step_<N>.json`` of ``dump_dir``, sorted by step."""
    paths = sorted(Path(dump_dir).glob("step_*.json"), key=lambda p: int(p.stem.split("_")[1]))
    if not paths:
        raise FileNotFoundError(f"no step_<N>.json in {dump_dir}: was the run started with cpo.credit_dump.steps?")
    return [json.loads(p.read_text()) for p in paths]


def pick_rows(dump: dict, per_kind: int) -> list[dict]:
    """Up to ``per_kind`` rows of each kind, in the dump's order."""
    picked = []
    for kind in ROW_KINDS:
        picked += [row for row in dump["rows"] if row["kind"] == kind][:per_kind]
    return picked


def _background(value: float, scale: float) -> str:
    x = max(-1.0, min(1.0, value / scale)) if scale > 0 else 0.0
    return f"rgba(30,100,255,{abs(x):.3f})" if x >= 0 else f"rgba(230,40,40,{abs(x):.3f})"


def second_value(row: dict, i: int) -> float:
    """The second colouring of token ``i``: the wrapper's advantage change, or a distribution-level method's loss."""
    if "advantage_shaped" in row:
        return row["advantage_shaped"][i] - row["advantage"][i]
    return row["token_loss"][i]


def _token_span(row: dict, i: int, delta_scale: float) -> str:
    change = second_value(row, i)
    title = f"token {i}: {row['tokens'][i]!r}\n"
    if "advantage_shaped" in row:
        title += (
            f"δ = {row['delta'][i]:.6f} (g = {row['teacher_log_probs'][i]:.6f}, o = {row['old_log_probs'][i]:.6f})\n"
            f"entropy = {row['entropy'][i]:.6f}\n"
            f"advantage {row['advantage'][i]:.6f} -> {row['advantage_shaped'][i]:.6f} (change {change:.6f})"
        )
    else:  # a distribution-level method reads no sampled-token δ (g = o there)
        top = ", ".join(f"{text!r} {log_prob:.3f}" for _, text, log_prob in row["teacher_topk"][i])
        title += (
            f"o = {row['old_log_probs'][i]:.6f}, entropy = {row['entropy'][i]:.6f}\ntoken loss {change:.6f}\n"
            f"teacher's top ids: {top}"
        )
    return (
        f'<span class="tok" data-delta="{row["delta"][i]!r}" data-adv="{change!r}" title="{html.escape(title)}" '
        f'style="background:{_background(row["delta"][i], delta_scale)}">{html.escape(row["tokens"][i])}</span>'
    )


def colour_scales(rows: list[dict]) -> tuple[float, float]:
    """Largest |δ| and largest |advantage change| over ``rows`` (one colour scale per step, so rows compare)."""
    deltas = [abs(v) for row in rows for v in row["delta"]]
    changes = [abs(second_value(row, i)) for row in rows for i in range(len(row["tokens"]))]
    return max(deltas, default=0.0) or 1e-6, max(changes, default=0.0) or 1e-6


def _row_html(row: dict, delta_scale: float, adv_scale: float) -> str:
    spans = "".join(_token_span(row, i, delta_scale) for i in range(len(row["tokens"])))
    verdict = "correct" if row["kind"] in ("mixed_correct", "all_correct") else "wrong"
    if "has_context" in row:
        verdict += ", teacher context" if row["has_context"] else ", no teacher context: out of the loss"
    return (
        f'<div class="resp"><div class="meta"><b>{row["kind"]}</b> ({verdict}) · reward {row["reward"]:g} · group '
        f"difficulty {row['difficulty']} · row {row['row']} · uid {html.escape(row['uid'])}</div>"
        f"<details><summary>prompt</summary><div class='prompt'>{html.escape(row['prompt'])}</div></details>"
        "<details><summary>teacher prompt</summary>"
        f"<div class='prompt'>{html.escape(row['hint_prompt'])}</div></details>"
        f'<div class="tokens" data-delta-scale="{delta_scale!r}" data-adv-scale="{adv_scale!r}">{spans}</div></div>'
    )


def render_report(dumps: list[dict], per_kind: int = 2, title: str = "CPO token credit") -> str:
    """The full HTML page."""
    sections = []
    for dump in dumps:
        rows = pick_rows(dump, per_kind)
        delta_scale, adv_scale = colour_scales(rows)
        body = "".join(_row_html(row, delta_scale, adv_scale) for row in rows) or "<p>(no rows)</p>"
        sections.append(
            f"<h2>step {dump['step']}</h2><p class='meta'>wrapper <code>{html.escape(dump['method'])}</code>, "
            f"α⁺ = {dump['pos_alpha']}, α⁻ = {dump['neg_alpha']}; {len(rows)} of {dump['batch_size']} responses; "
            f"entropy: {html.escape(dump['entropy_source'])}; full colour at |δ| = {delta_scale:.3g} and at "
            f"|advantage change or token loss| = {adv_scale:.3g}</p>{body}"
        )
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_STYLE}</style><script>{_SCRIPT}</script></head><body>"
        f"<h1>{html.escape(title)}</h1>"
        "<p>Each response token is coloured by <b id='mode'>δ = g − o</b>: blue where the hint-guided prompt makes the "
        "sampled token more likely (g > o, or a positive advantage change), red where less; white is 0. One colour "
        "scale per step (given under its title). Hover a token for its exact values.</p>"
        "<p><label><input type='radio' name='m' id='m-delta' checked onclick=\"paint('delta')\"> "
        "δ = teacher_log_probs − old_log_probs</label> &nbsp; "
        "<label><input type='radio' name='m' id='m-adv' onclick=\"paint('adv')\"> "
        "advantage change of the wrapper, or the per-token loss of a distribution-level method (open the page as "
        "report.html#adv to start with it)"
        "</label></p>" + "".join(sections) + "</body></html>"
    )


def build_report(dump_dir: Path | str, html_path: Path | str, per_kind: int = 2) -> Path:
    """Write the report of ``dump_dir`` to ``html_path``."""
    html_path = Path(html_path)
    html_path.write_text(render_report(load_dumps(dump_dir), per_kind), encoding="utf-8")
    return html_path
