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
"""The shipped warm start: the default warm start is the model shipped with the project, checked against its recorded
hashes whenever a run takes it, so every machine trains from the same weights (an SFT rebuild differs from machine
to machine). The tests that build a warm start of their own (``test_sft_loss_on_cpu.py``) test verl's SFT itself."""

import shutil

import pytest

from treetune_scripts.experiments import warm_start
from treetune_scripts.experiments.warm_start import (
    DEFAULT_WARM_START,
    SHIPPED_DIR,
    SHIPPED_SHA256,
    WarmStartIntegrityError,
    build_warm_start,
    check_shipped_files,
    file_sha256,
    read_build_info,
)


def test_every_shipped_file_has_its_recorded_hash():
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"} <= set(SHIPPED_SHA256)
    check_shipped_files(SHIPPED_DIR)


def test_a_changed_or_missing_shipped_file_is_refused(tmp_path):
    copy = shutil.copytree(SHIPPED_DIR, tmp_path / "model")
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of the last weight
    weights.write_bytes(bytes(data))
    with pytest.raises(WarmStartIntegrityError, match="model.safetensors: sha256"):
        check_shipped_files(copy)
    (copy / "tokenizer.json").unlink()
    shutil.copy2(SHIPPED_DIR / "model.safetensors", weights)
    with pytest.raises(WarmStartIntegrityError, match="tokenizer.json: sha256 missing"):
        check_shipped_files(copy)


def test_the_default_warm_start_is_the_shipped_model_and_needs_no_sft(tmp_path, monkeypatch):
    def no_sft(*args, **kwargs):
        raise AssertionError("the default warm start must not run the SFT")

    monkeypatch.setattr(warm_start, "run_sft", no_sft)
    folder = build_warm_start(DEFAULT_WARM_START, tmp_path)
    for name, expected in SHIPPED_SHA256.items():
        assert file_sha256(folder / "model" / name) == expected, name
    info = read_build_info(folder)
    assert info["source"].startswith("shipped") and info["weights_sha256"] == SHIPPED_SHA256["model.safetensors"]
    assert 0 < info["val_acc_plain"] < info["val_acc_hint"]  # measured on this machine from the shipped weights
    assert (folder / "data" / "train.parquet").is_file()
    # Every later use checks the cached copy again.
    assert build_warm_start(DEFAULT_WARM_START, tmp_path) == folder
    (folder / "model" / "config.json").write_text("{}")
    with pytest.raises(WarmStartIntegrityError, match="config.json"):
        build_warm_start(DEFAULT_WARM_START, tmp_path)
