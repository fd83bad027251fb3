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
"""The shipped warm start: the default warm start's weights ship with the project, checked against their recorded hash
whenever a run takes them, so every machine trains from the same weights (an SFT rebuild differs from machine to
machine); config and tokenizer come from the tiny assets of the user's own environment, with the vocabulary the weights
were trained with. The tests that build a warm start of their own (``test_sft_loss_on_cpu.py``) test verl's SFT."""

import shutil

import pytest
import torch
from safetensors.torch import load_file

from treetune_recipe.cpo.experiments import warm_start
from treetune_recipe.cpo.experiments.warm_start import (
    DEFAULT_WARM_START,
    EXPERIMENT_WARM_START,
    EXPERIMENT_WEIGHTS,
    SHIPPED_VOCAB_SHA256,
    SHIPPED_WEIGHTS,
    SHIPPED_WEIGHTS_SHA256,
    WarmStartIntegrityError,
    build_warm_start,
    check_shipped_weights,
    file_sha256,
    read_build_info,
    vocab_sha256,
)


def test_the_shipped_weights_have_their_recorded_hash_and_a_changed_bit_is_refused(tmp_path):
    check_shipped_weights(SHIPPED_WEIGHTS)
    changed = tmp_path / "model.safetensors"
    data = bytearray(SHIPPED_WEIGHTS.read_bytes())
    data[-1] ^= 1  # one bit of the last weight
    changed.write_bytes(bytes(data))
    with pytest.raises(WarmStartIntegrityError, match="model.safetensors: sha256"):
        check_shipped_weights(changed)
    with pytest.raises(WarmStartIntegrityError, match="sha256 missing"):
        check_shipped_weights(tmp_path / "absent.safetensors")


def test_the_experiments_weights_have_their_own_recorded_hash():
    """Both shipped files are checked against their own hash: neither stands in for the other."""
    check_shipped_weights(EXPERIMENT_WEIGHTS, EXPERIMENT_WARM_START)
    with pytest.raises(WarmStartIntegrityError, match="experiment.safetensors from the repository"):
        check_shipped_weights(SHIPPED_WEIGHTS, EXPERIMENT_WARM_START)
    with pytest.raises(WarmStartIntegrityError, match="model.safetensors from the repository"):
        check_shipped_weights(EXPERIMENT_WEIGHTS, DEFAULT_WARM_START)


def test_the_default_warm_start_is_the_shipped_model_and_needs_no_sft(tmp_path, monkeypatch):
    def no_sft(*args, **kwargs):
        raise AssertionError("the default warm start must not run the SFT")

    monkeypatch.setattr(warm_start, "run_sft", no_sft)
    folder = build_warm_start(DEFAULT_WARM_START, tmp_path)
    assert file_sha256(folder / "model" / "model.safetensors") == SHIPPED_WEIGHTS_SHA256
    assert vocab_sha256(folder / "model") == SHIPPED_VOCAB_SHA256
    info = read_build_info(folder)
    assert info["source"].startswith("shipped") and info["weights_sha256"] == SHIPPED_WEIGHTS_SHA256
    assert 0 < info["val_acc_plain"] < info["val_acc_hint"]  # measured on this machine from the shipped weights
    assert (folder / "data" / "train.parquet").is_file()
    # The weights are the trained ones, not the assets' random initialisation.
    assets_weights = load_file(next(tmp_path.glob("*/model/model.safetensors")))
    shipped = load_file(SHIPPED_WEIGHTS)
    assert not torch.equal(assets_weights["model.embed_tokens.weight"], shipped["model.embed_tokens.weight"])
    # Every later use checks the cached copy again.
    assert build_warm_start(DEFAULT_WARM_START, tmp_path) == folder
    shutil.copy2(next(tmp_path.glob("*/model/model.safetensors")), folder / "model" / "model.safetensors")
    with pytest.raises(WarmStartIntegrityError, match="model.safetensors"):
        build_warm_start(DEFAULT_WARM_START, tmp_path)


def test_a_tokenizer_with_another_vocabulary_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(warm_start, "SHIPPED_VOCAB_SHA256", "0" * 64)
    with pytest.raises(WarmStartIntegrityError, match="the tokenizer build changed"):
        build_warm_start(DEFAULT_WARM_START, tmp_path)
