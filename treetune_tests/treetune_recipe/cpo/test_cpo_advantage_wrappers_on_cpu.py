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
"""The 18 CPO advantage wrappers and their primitives.

Expectations come from (1) the golden vectors computed by running the reference fork's functions
(``treetune_tests/fixtures/cpo_wrappers_golden.json``, a copy of ``shared/spec/cpo_wrappers_golden.json``) and
(2) an independent re-implementation below written in the reference's style (in-place boolean-index updates, one
branch per name), run on random inputs that also exercise λ ≠ 2, negative α, rewards outside ±1 and all D values.
"""

import inspect
import json
import types
from pathlib import Path

import pytest
import torch

from treetune_recipe.cpo.methods.cpo_wrappers import (
    minmax_uncertainty,
    mutual_information,
    register_cpo_wrapper,
    sequence_mean,
)
from treetune_recipe.cpo.methods.registry import CPO_WRAPPERS, get_cpo_wrapper
from treetune_recipe.cpo.methods.rlsd import RLSDKnobs

GOLDEN = json.loads((Path(__file__).parents[2] / "fixtures" / "cpo_wrappers_golden.json").read_text())

ALL_NAMES = [
    "naive", "naive_qwen3", "noaccmask", "mi", "mi_accmask", "mi_unify", "mi_clamp_unify",
    "mi_clamp_unify_difficulty", "mi3", "negonly_mi3", "negonly_mi", "reverse_mi3", "addition_mi3", "mi2",
    "negonly_seq_kl", "seq_kl", "negonly_tok_kl", "tok_kl",
]  # fmt: skip
# The privileged-context peers on the same hinted pass (not in the reference fork).
PEERS = ["rlsd", "opsd_token"]
# Wrappers that end with the reference's sign clamps (A ≥ 0 on r = 1, A ≤ 0 on r = -1), even with both α = 0.
SIGN_CLAMPED = {"naive_qwen3", "noaccmask", "mi", "mi_accmask", "mi_unify", "mi_clamp_unify"}
# Wrappers that read the row max of H over all positions, padding included (reference quirk).
UNMASKED_ENTROPY_MAX = {"naive", "naive_qwen3", "noaccmask"}


def _t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def _call(name, inputs: dict, cfg) -> torch.Tensor:
    return CPO_WRAPPERS[name](cfg=cfg, **inputs)


# ---------------------------------------------------------------------------------------------------------------------
# Golden vectors from the reference implementation
# ---------------------------------------------------------------------------------------------------------------------


def _golden_cases() -> list:
    """(key, name, case, difficulty, config) for every golden entry that applies to this implementation.

    Skipped on purpose: entries with ``yw=...`` (the ``yw_rewards`` input is dropped: the reference pipeline never
    produced it, and seq_kl/tok_kl crashed with it) and ``DISPATCH_tok_kl+*`` (the reference's buggy dispatch
    applied the naive fallback after tok_kl; here one name is one wrapper).
    """
    cases = []
    for key in GOLDEN["results"]:
        parts = key.split("|")
        if parts[0].startswith("DISPATCH_") or any(part.startswith("yw=") for part in parts):
            continue
        name, case, difficulty, config = parts
        cases.append(pytest.param(name, case, difficulty, config, id=key))
    return cases


def _golden_inputs(case: str, difficulty: str) -> dict:
    inputs, tensors = GOLDEN["inputs"], GOLDEN["inputs"][f"case_{case}"]
    return dict(
        advantages=_t(inputs["advantages"]),
        teacher_log_probs=_t(tensors["gw_yl_log_probs"]),
        old_log_probs=_t(tensors["old_log_probs"]),
        entropy=_t(inputs["entropys"]),
        response_mask=_t(inputs["response_mask"]),
        seq_rewards=_t(inputs["token_level_rewards"]).sum(-1),
        difficulty=_t(inputs["difficulty"][difficulty]),
    )


def test_golden_file_covers_every_wrapper():
    covered = {param.values[0] for param in _golden_cases()}
    assert covered == set(ALL_NAMES)
    assert len(_golden_cases()) == 144


@pytest.mark.parametrize("name, case, difficulty, config", _golden_cases())
def test_wrapper_matches_reference_golden(name, case, difficulty, config):
    cfg = types.SimpleNamespace(**GOLDEN["configs"][config])
    out = _call(name, _golden_inputs(case, difficulty), cfg)
    expected = _t(GOLDEN["results"][f"{name}|{case}|{difficulty}|{config}"]["out"])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("case", ["A", "B"])
def test_primitives_match_reference_intermediates(case):
    inputs, expected = _golden_inputs(case, "D0"), GOLDEN["intermediates"][case]
    g, o, mask = inputs["teacher_log_probs"], inputs["old_log_probs"], inputs["response_mask"]
    torch.testing.assert_close(mutual_information(g, o), _t(expected["mi"]), atol=1e-5, rtol=0)
    # The golden padded column of U is whatever the reference left there; only valid tokens are ever read.
    uncertainty = minmax_uncertainty(inputs["entropy"], mask.bool())
    torch.testing.assert_close(uncertainty, _t(expected["uncert_minmax"]), atol=1e-5, rtol=0)
    torch.testing.assert_close(sequence_mean(g - o, mask).squeeze(-1), _t(expected["seq_kl_mean"]))
    torch.testing.assert_close(sequence_mean(inputs["entropy"], mask).squeeze(-1), _t(expected["seq_entropy_mean"]))
    # mi2's second return value in the reference was MI itself.
    mi2_key = f"mi2|{case}|D0|C1"
    torch.testing.assert_close(
        mutual_information(g, o), _t(GOLDEN["results"][mi2_key]["second_return"]), atol=1e-5, rtol=0
    )


# ---------------------------------------------------------------------------------------------------------------------
# Independent reference-style implementation (written from each formula), for random inputs
# ---------------------------------------------------------------------------------------------------------------------


def reference_style(name, advantages, g, o, entropy, mask, rewards, difficulty, cfg) -> torch.Tensor:
    """The spec's statements written like the fork: boolean-index in-place updates on a copy, in order."""
    adv = advantages.clone()
    bsz, width = adv.shape
    valid = mask.bool()
    r1 = (rewards == 1)[:, None].expand(bsz, width)
    rm1 = (rewards == -1)[:, None].expand(bsz, width)
    rn1 = ~r1
    d = difficulty[:, None].expand(bsz, width)
    lam, ap, an = cfg.cpo_lambda, cfg.pos_alpha, cfg.neg_alpha
    kl = g - o
    ratio = torch.clamp(torch.exp(kl), 1 / lam, lam)
    mi = torch.exp(g) * kl
    mi_c = torch.clamp(mi, max=10)
    kl_c = torch.clamp(kl, -10, 10)
    h_min = entropy.clone()
    h_min[~valid] = float("inf")
    h_max = entropy.clone()
    h_max[~valid] = float("-inf")
    h_min, h_max = h_min.min(-1, keepdim=True).values, h_max.max(-1, keepdim=True).values
    unc = (entropy - h_min) / (h_max - h_min + 1e-8)
    kl_mean = ((kl * mask).sum(-1) / (mask.sum(-1) + 1e-10))[:, None].expand(bsz, width)
    h_mean = ((entropy * mask).sum(-1) / (mask.sum(-1) + 1e-10))[:, None].expand(bsz, width)
    row_max = entropy.max(-1, keepdim=True).values.expand(bsz, width)

    def update(where, value):
        value = value.expand(bsz, width) if torch.is_tensor(value) else torch.full_like(adv, value)
        adv[where] = adv[where] + value[where]

    def final_clamps():
        pos, neg = valid & r1, valid & rm1
        adv[pos] = torch.clamp(adv[pos], min=0)
        adv[neg] = torch.clamp(adv[neg], max=0)

    s_pos = valid & (ratio >= lam) & (torch.exp(g) > 0.1)
    s_neg = valid & (ratio <= 1 / lam) & (torch.exp(o) > 0.1)
    if name in ("naive", "noaccmask", "naive_qwen3"):
        if name == "naive_qwen3":
            s_pos, s_neg = s_pos & r1, s_neg & rm1
        if ap:
            update(s_pos, ap * entropy)
        if an:
            update(s_neg, -an * (row_max - entropy))
        if name != "naive":
            final_clamps()
    elif name == "mi":
        if ap:
            update(valid & (mi >= 0), ap * mi * unc)
        if an:
            update(valid & (mi < 0), an * mi * (1 - unc))
        final_clamps()
    elif name == "mi_accmask":
        if ap:
            update(valid & (mi >= 0) & r1, ap * mi * (1 + unc))
        if an:
            update(valid & (mi < 0) & rm1, an * mi * (2 - unc))
        final_clamps()
    elif name in ("mi_unify", "mi_clamp_unify"):
        m = mi if name == "mi_unify" else mi_c
        if ap:
            update(valid & r1, ap * m * (1 - unc))
        if an:
            update(valid & rm1, an * m * (1 - unc))
        final_clamps()
    elif name == "mi_clamp_unify_difficulty":
        if ap:
            update(valid & (d != 0), ap * mi_c * (1 - unc))
        if an:
            update(valid & (d == 0), an * mi_c * (1 - unc))
    elif name in ("mi3", "negonly_mi3", "reverse_mi3", "addition_mi3"):
        neg = valid & rn1 & (d == -1) if name == "negonly_mi3" else valid & rn1
        sign = -1.0 if name == "reverse_mi3" else 1.0
        if ap:
            update(valid & r1, ap * unc)
        if an:
            update(neg & (mi >= 0), sign * an * mi * unc)
            if name != "addition_mi3":
                update(neg & (mi < 0), sign * an * mi * (1 - unc))
    elif name in ("negonly_mi", "mi2", "negonly_tok_kl"):
        neg = valid & rn1 if name == "mi2" else valid & rn1 & (d == -1)
        if ap:
            update(valid & r1, ap * unc)
        if an:
            update(neg, an * (kl_c if name == "negonly_tok_kl" else mi))
    elif name == "negonly_seq_kl":
        if ap:
            update(valid & r1, ap * kl_mean)
        if an:
            update(valid & rn1 & (d == -1), an * kl_mean)
    elif name == "seq_kl":
        if ap:
            update(valid & r1 & (d == 1), ap * h_mean)
            update(valid & r1 & (d != 1), torch.maximum(ap * h_mean, -adv.abs() / 2))
        if an:
            update(valid & rn1 & (d == -1), an * kl_mean)
            update(valid & rn1 & (d != -1), torch.minimum(an * kl_mean, adv.abs() / 2))
    elif name == "tok_kl":
        if ap:
            update(valid & r1, ap * unc)
        if an:
            update(valid & rn1 & (d == -1), an * kl_c)
            update(valid & rn1 & (d != -1), torch.minimum(an * kl_c, adv.abs() / 2))
    else:
        raise AssertionError(name)
    return adv


def random_inputs(seed: int, bsz: int = 12, width: int = 9) -> dict:
    """Random batch with ragged lengths (one fully padded row), poisoned padding, rewards in {1, -1, 0, 0.5}."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (bsz,), generator=gen)
    lengths[0] = 0
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    rewards = torch.tensor([1.0, -1.0, 0.0, 0.5])[torch.randint(0, 4, (bsz,), generator=gen)]
    difficulty = torch.tensor([-1.0, 0.0, 1.0])[torch.randint(0, 3, (bsz,), generator=gen)]
    advantages = torch.randn(bsz, 1, generator=gen) * mask
    old = -torch.rand(bsz, width, generator=gen) * 4
    gw = old + torch.randn(bsz, width, generator=gen) * 2
    gw = gw.clamp(max=0)
    gw[1, 0] = old[1, 0] + 13.0  # a log-ratio beyond the ±10 clamp
    entropy = torch.rand(bsz, width, generator=gen) * 3
    pad = ~mask.bool()
    gw[pad], old[pad], entropy[pad] = -0.01, -9.0, 7.0  # poisoned padding (the reference pads with zeros)
    return dict(
        advantages=advantages,
        teacher_log_probs=gw,
        old_log_probs=old,
        entropy=entropy,
        response_mask=mask,
        seq_rewards=rewards,
        difficulty=difficulty,
    )


RANDOM_CONFIGS = [
    types.SimpleNamespace(cpo_lambda=2.0, pos_alpha=0.3, neg_alpha=0.5),
    types.SimpleNamespace(cpo_lambda=1.5, pos_alpha=-0.2, neg_alpha=1.0),
    types.SimpleNamespace(cpo_lambda=3.0, pos_alpha=None, neg_alpha=-0.7),
    types.SimpleNamespace(cpo_lambda=2.0, pos_alpha=0.4, neg_alpha=0),
]


@pytest.mark.parametrize("name", ALL_NAMES)
@pytest.mark.parametrize("seed", [0, 1])
def test_wrapper_matches_reference_style_on_random_inputs(name, seed):
    inputs = random_inputs(seed)
    for cfg in RANDOM_CONFIGS:
        out = _call(name, inputs, cfg)
        expected = reference_style(
            name,
            inputs["advantages"],
            inputs["teacher_log_probs"],
            inputs["old_log_probs"],
            inputs["entropy"],
            inputs["response_mask"],
            inputs["seq_rewards"],
            inputs["difficulty"],
            cfg,
        )
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=0, msg=f"{name} {cfg}")


# ---------------------------------------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------------------------------------

C1 = types.SimpleNamespace(cpo_lambda=2.0, pos_alpha=0.3, neg_alpha=0.5, rlsd=RLSDKnobs(mix_lambda=0.5, clip=0.2))


@pytest.mark.parametrize("name", ALL_NAMES + PEERS)
def test_wrapper_never_modifies_its_inputs(name):
    inputs = random_inputs(3)
    before = {key: value.clone() for key, value in inputs.items()}
    out = _call(name, inputs, C1)
    for key, value in inputs.items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0, msg=key)
    assert out.data_ptr() != inputs["advantages"].data_ptr()


@pytest.mark.parametrize("name", ALL_NAMES + PEERS)
def test_padding_is_returned_unchanged_and_never_read_except_entropy_row_max(name):
    inputs = random_inputs(4)
    pad = ~inputs["response_mask"].bool()
    out = _call(name, inputs, C1)
    torch.testing.assert_close(out[pad], inputs["advantages"][pad], rtol=0, atol=0)
    assert not out.isnan().any()

    repoisoned = dict(inputs)
    repoisoned["teacher_log_probs"] = inputs["teacher_log_probs"].masked_fill(pad, -0.5)
    repoisoned["old_log_probs"] = inputs["old_log_probs"].masked_fill(pad, -30.0)
    torch.testing.assert_close(_call(name, repoisoned, C1), out, rtol=0, atol=0)

    repoisoned["entropy"] = inputs["entropy"].masked_fill(pad, 50.0)
    changed = not torch.equal(_call(name, repoisoned, C1), out)
    assert changed == (name in UNMASKED_ENTROPY_MAX)  # the naive family's unmasked row max is kept


@pytest.mark.parametrize("name", ALL_NAMES + PEERS)
def test_constant_entropy_gives_finite_advantages(name):
    inputs = random_inputs(5)
    inputs["entropy"] = torch.full_like(inputs["entropy"], 0.7)
    assert torch.isfinite(_call(name, inputs, C1)).all()


@pytest.mark.parametrize("name", ALL_NAMES)
@pytest.mark.parametrize("zero", [0, 0.0, None])
def test_zero_alphas_are_identity_up_to_the_reference_sign_clamps(name, zero):
    inputs = random_inputs(6)
    cfg = types.SimpleNamespace(cpo_lambda=2.0, pos_alpha=zero, neg_alpha=zero)
    out = _call(name, inputs, cfg)
    expected = inputs["advantages"].clone()
    if name in SIGN_CLAMPED:  # documented reference behaviour: the final clamps run whatever the alphas
        valid = inputs["response_mask"].bool()
        rewards = inputs["seq_rewards"][:, None]
        expected = torch.where(valid & (rewards == 1), expected.clamp(min=0), expected)
        expected = torch.where(valid & (rewards == -1), expected.clamp(max=0), expected)
        assert not torch.equal(expected, inputs["advantages"])  # the clamps do fire on these inputs
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_exact_reward_equality_decides_correctness():
    inputs = random_inputs(7)
    inputs["seq_rewards"] = torch.full_like(inputs["seq_rewards"], 1.0 - 1e-6)  # "almost correct" is wrong
    as_wrong = _call("mi2", inputs, C1)
    valid = inputs["response_mask"].bool()
    mi = mutual_information(inputs["teacher_log_probs"], inputs["old_log_probs"])
    torch.testing.assert_close(as_wrong[valid], (inputs["advantages"] + 0.5 * mi)[valid])


# ---------------------------------------------------------------------------------------------------------------------
# Privileged-context peers: values worked out by hand
# ---------------------------------------------------------------------------------------------------------------------

LN = torch.log(torch.tensor([1.1, 2.0])).tolist()  # ln 1.1, ln 2


def _peer_inputs() -> dict:
    """Three responses: A = +2 (3 tokens), A = -1 (3 tokens and one pad), A = 0 (2 tokens, an all-wrong group)."""
    old = _t([[-1.0, -2.0, -0.5, -0.3], [-0.7, -1.5, -2.0, -0.1], [-3.0, -0.2, -0.4, -0.4]])
    delta = _t([[LN[0], LN[1], -LN[1], 0.0], [LN[0], LN[1], 0.0, 9.0], [5.0, -5.0, 0.0, 0.0]])
    mask = _t([[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 0, 0]])
    advantages = _t([[2.0, 2.0, 2.0, 0.0], [-1.0, -1.0, -1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    return dict(
        advantages=advantages,
        teacher_log_probs=old + delta,
        old_log_probs=old,
        entropy=torch.ones(3, 4),
        response_mask=mask,
        seq_rewards=_t([1.0, -1.0, -1.0]),
        difficulty=_t([0.0, 0.0, -1.0]),
    )


def test_rlsd_by_hand():
    # λ = 0.5, ε = 0.2. Row 1 (sign +): w = exp(δ) = 1.1, 2, 0.5 -> clip 1.1, 1.2, 0.8 -> 0.5 + 0.5 w = 1.05, 1.1, 0.9
    # -> Â = 2.1, 2.2, 1.8. Row 2 (sign -): w = exp(-δ) = 1/1.1, 0.5, 1 -> clip 0.90909, 0.8, 1 -> 0.954545, 0.9, 1
    # -> Â = -0.954545, -0.9, -1. Row 3: A = 0 -> Â = 0, whatever δ (±5). Padding as given.
    cfg = types.SimpleNamespace(rlsd=RLSDKnobs(mix_lambda=0.5, clip=0.2))
    expected = _t([[2.1, 2.2, 1.8, 0.0], [-0.5 - 0.5 / 1.1, -0.9, -1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(_call("rlsd", _peer_inputs(), cfg), expected)


@pytest.mark.parametrize(("rlsd_lambda", "rlsd_clip"), [(0.0, 0.2), (1.0, 0.0), (0.7, 0.0)])
def test_rlsd_without_a_teacher_weight_is_grpo(rlsd_lambda, rlsd_clip):
    inputs = _peer_inputs()
    cfg = types.SimpleNamespace(rlsd=RLSDKnobs(mix_lambda=rlsd_lambda, clip=rlsd_clip))
    torch.testing.assert_close(_call("rlsd", inputs, cfg), inputs["advantages"], rtol=0, atol=0)


def test_rlsd_full_weight_is_the_clipped_teacher_ratio():
    # λ = 1, ε = 0.5: Â = A·clip(exp(sign(A)·δ), 0.5, 1.5); row 1: 2·(1.1, 1.5 (from 2), 0.5) = 2.2, 3, 1;
    # row 2: -1·(1/1.1, 0.5, 1)
    cfg = types.SimpleNamespace(rlsd=RLSDKnobs(mix_lambda=1.0, clip=0.5))
    expected = _t([[2.2, 3.0, 1.0, 0.0], [-1 / 1.1, -0.5, -1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(_call("rlsd", _peer_inputs(), cfg), expected)


def test_opsd_token_by_hand():
    # Â = δ on valid tokens, the verifier's A unused; the all-wrong row (A = 0) gets δ = +5, -5; padding as given.
    expected = _t([[LN[0], LN[1], -LN[1], 0.0], [LN[0], LN[1], 0.0, 0.0], [5.0, -5.0, 0.0, 0.0]])
    torch.testing.assert_close(_call("opsd_token", _peer_inputs(), types.SimpleNamespace()), expected)


def test_a_corrupted_teacher_pass_changes_both_peers():
    # The control: with the hinted log-probs shifted by one token, the hand-worked values no longer hold.
    inputs = _peer_inputs()
    shifted = dict(inputs, teacher_log_probs=inputs["teacher_log_probs"].roll(1, dims=-1))
    cfg = types.SimpleNamespace(rlsd=RLSDKnobs(mix_lambda=0.5, clip=0.2))
    assert not torch.allclose(_call("rlsd", shifted, cfg), _call("rlsd", inputs, cfg))
    assert not torch.allclose(_call("opsd_token", shifted, cfg), _call("opsd_token", inputs, cfg))


# ---------------------------------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------------------------------


def test_registry_has_the_18_reference_names_and_the_peers_with_the_public_signature():
    assert sorted(CPO_WRAPPERS) == sorted(ALL_NAMES + PEERS)
    expected = ["advantages", "teacher_log_probs", "old_log_probs", "entropy", "response_mask", "seq_rewards",
                "difficulty", "cfg"]  # fmt: skip
    for name, fn in CPO_WRAPPERS.items():
        params = inspect.signature(fn).parameters
        assert list(params) == expected, name
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in list(params.values())[1:]), name
        assert fn.__doc__ and fn.__name__ == name
        assert get_cpo_wrapper(name) is fn


def test_unknown_wrapper_lists_every_valid_name():
    with pytest.raises(ValueError, match="naive_qwen") as info:
        get_cpo_wrapper("naive_qwen")
    assert all(name in str(info.value) for name in ALL_NAMES)


def test_duplicate_registration_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        register_cpo_wrapper("seq_kl")(lambda advantages, **_: advantages)
    assert CPO_WRAPPERS["seq_kl"].__name__ == "seq_kl"
