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
"""The agent-doc checker (``treetune_scripts/agent_docs/``, command line ``treetune_scripts/check_agent_docs.py``)
itself: on a fake doc it reports exactly the broken references and its command line exits 1, it classifies spans as
the module docstring of ``references`` says, it checks the indexes, and it finds the files of each supported verl
release.
"""

import re

import pytest

from treetune_scripts import check_agent_docs
from treetune_scripts.agent_docs import checks, references, releases
from treetune_verl.version import SUPPORTED_VERL_VERSIONS


@pytest.fixture(scope="module")
def context():
    return references.compose_context()


FAKE_DOC = """---
summary: fake
read_when:
  - testing the checker
---
Good: `treetune_verl/patches.py`, `treetune_verl/patches.py:use_trainer_class`, `treetune_verl/patches.py:1-3`,
`verl/trainer/ppo/ray_trainer.py:RayPPOTrainer.fit`, `verl/trainer/ppo/ray_trainer.py:1230`, `verl/workers/`,
`treetune_recipe.cpo.methods.loss.cpo_ppo_loss`, `verl.workers.utils.losses:ppo_loss`, `cpo.hint.on_missing`,
`actor_rollout_ref.actor.calculate_entropy`, `platform=cpu`, `+data.apply_chat_template_kwargs.enable_thinking=true`,
`actor/cpo/adv_delta_absmean/{correct,wrong}`, `timing_s/cpo_gw_log_prob`, `critic/score/mean`, `make demo`,
`python -m treetune_scripts.run_demo --steps 2`, `pkg://verl.trainer.config`, `<placeholder>`, `cpo.hint.*`,
`RayCPOTrainer`, `train.log`.
Releases: `verl/trainer/main_ppo_v0.py:TaskRunner.run`, `0.9.1:verl/trainer/main_ppo_v0.py:136-137`,
`verl.trainer.main_ppo_v0:TaskRunner`, `0.7.1:verl/trainer/main_ppo.py:TaskRunner.run`,
`0.7.1:verl/trainer/main_ppo.py:343`, `0.7.1:verl.trainer.main_ppo:TaskRunner`,
`0.7.1:verl/workers/fsdp_workers.py:AsyncActorRolloutRefWorker`.
Bad: `treetune_verl/no_such_file.py`, `verl/trainer/ppo/ray_trainer.py:999999`, `treetune_verl/patches.py:nope`,
`treetune_recipe.cpo.no_such_module`, `verl.workers.utils.losses:no_such_loss`, `cpo.hint.no_such_key`,
`platform=gpu`, `actor/cpo/no_such_metric`, `make no-such-target`, `no_such_file.yaml`, `pkg://treetune_verl.nope`.
Bad releases: `verl/trainer/main_ppo.py:TaskRunner`, `0.9.1:verl/workers/fsdp_workers.py`,
`0.7.1:verl/trainer/main_ppo_v0.py`, `0.7.1:verl/trainer/main_ppo.py:999`,
`0.7.1:verl/trainer/main_ppo.py:TaskRunnerV1`, `0.7.1:verl.trainer.main_ppo_v0:TaskRunner`,
`0.8.0:verl/trainer/main_ppo.py`.
```bash
make test
python -m treetune_scripts.no_such_script
```
"""
FAKE_BAD = [
    "treetune_verl/no_such_file.py",
    "verl/trainer/ppo/ray_trainer.py:999999",
    "treetune_verl/patches.py:nope",
    "treetune_recipe.cpo.no_such_module",
    "verl.workers.utils.losses:no_such_loss",
    "cpo.hint.no_such_key",
    "platform=gpu",
    "actor/cpo/no_such_metric",
    "make no-such-target",
    "no_such_file.yaml",
    "pkg://treetune_verl.nope",
    "verl/trainer/main_ppo.py:TaskRunner",
    "0.9.1:verl/workers/fsdp_workers.py",
    "0.7.1:verl/trainer/main_ppo_v0.py",
    "0.7.1:verl/trainer/main_ppo.py:999",
    "0.7.1:verl/trainer/main_ppo.py:TaskRunnerV1",
    "0.7.1:verl.trainer.main_ppo_v0:TaskRunner",
    "0.8.0:verl/trainer/main_ppo.py",
    "python -m treetune_scripts.no_such_script",
]


def test_checker_reports_exactly_the_broken_references_of_a_fake_doc(context):
    problems = checks.check_doc_text(FAKE_DOC, context, name="fake.md")
    reported = [re.search(r"`([^`]+)`", problem).group(1) for problem in problems]
    assert reported == FAKE_BAD, "\n".join(problems)
    assert checks.front_matter_problems(FAKE_DOC, "fake.md") == []


def test_checker_rejects_missing_or_incomplete_front_matter():
    assert checks.front_matter_problems("# no front-matter\n", "a.md") == [
        "a.md: no front-matter (--- summary/read_when --- at the top)"
    ]
    problems = checks.front_matter_problems("---\nsummary: x\nread_when: []\n---\nbody\n", "b.md")
    assert problems == ["b.md: front-matter needs a non-empty read_when list of strings"]


@pytest.mark.parametrize(
    ("span", "kind"),
    [
        ("make test", "command"),
        ("trainer.device=cpu", "override"),
        ("actor/pg_loss", "metric"),
        ("pkg://treetune_verl.config", "pkg"),
        ("functools.partial(cpo_ppo_loss, ...)", "snippet"),
        ("<model dir>", "snippet"),
        ("verl/protocol.py:DataProto", "verl_path"),
        ("0.7.1:verl/trainer/main_ppo.py:343", "verl_path"),
        ("0.7.1:verl.trainer.main_ppo:TaskRunner", "module"),
        ("0.7.1: verl/trainer/main_ppo.py", "snippet"),
        ("Makefile", "repo_path"),
        ("treetune_verl.preflight", "module"),
        ("trainer.use_legacy_worker_impl", "config_key"),
        ("VERL_USE_EXTERNAL_MODULES", "other"),
        ("hydra.run.dir", "other"),
    ],
)
def test_span_classification(span, kind):
    roots = {"trainer", "actor_rollout_ref", "cpo", "data", "ray_kwargs"}
    assert references.classify(span, roots) == kind


def test_release_files_are_found_per_release(tmp_path):
    for release in SUPPORTED_VERL_VERSIONS:
        folder = releases.verl_release_dir(release)
        installed = (folder.parent / f"verl-{release}.dist-info").is_dir()
        assert installed or folder.is_relative_to(releases.RELEASES_CACHE)
    with pytest.raises(releases.ReleaseFilesUnavailable, match="not a supported release"):
        releases.verl_release_dir("0.8.0")
    site_packages = tmp_path / "lib" / "python3.11" / "site-packages"
    (site_packages / "verl").mkdir(parents=True)
    (site_packages / "verl-0.7.1.dist-info").mkdir()
    assert releases._site_packages_verl(tmp_path, "0.7.1") == site_packages / "verl"
    assert releases._site_packages_verl(tmp_path, "0.9.1") is None  # another release's environment is not used


def test_the_command_line_exits_1_and_names_each_broken_reference(tmp_path, capsys):
    good, bad = tmp_path / "good.md", tmp_path / "bad.md"
    good.write_text("`treetune_verl/patches.py` and `make test`.\n")
    bad.write_text("`treetune_verl/no_such_file.py` and `make no-such-target`.\n")
    assert check_agent_docs.main([str(good)]) == 0
    assert capsys.readouterr().out == ""
    assert check_agent_docs.main([str(good), str(bad)]) == 1
    printed = capsys.readouterr().out.splitlines()
    assert [re.search(r"`([^`]+)`", line).group(1) for line in printed] == FAKE_BAD[:1] + ["make no-such-target"]


def test_index_check_names_an_unindexed_doc_and_a_long_claude_md(tmp_path):
    (tmp_path / "agent-docs").mkdir()
    for name in checks.REQUIRED_AGENT_DOCS:
        (tmp_path / "agent-docs" / name).write_text("")
    index = "".join(f"- `{name}`\n" for name in checks.REQUIRED_AGENT_DOCS)
    (tmp_path / "agent-docs" / "README.md").write_text(index)
    (tmp_path / "CLAUDE.md").write_text("".join(f"agent-docs/{name}\n" for name in checks.REQUIRED_AGENT_DOCS))
    (tmp_path / "AGENTS.md").write_text("See CLAUDE.md.\n")
    assert checks.index_problems(tmp_path) == []
    (tmp_path / "agent-docs" / "new-guide.md").write_text("")
    (tmp_path / "CLAUDE.md").write_text((tmp_path / "CLAUDE.md").read_text() + "line\n" * 130)
    assert checks.index_problems(tmp_path) == [
        "agent-docs/README.md does not index new-guide.md",
        "CLAUDE.md does not index new-guide.md",
        f"CLAUDE.md has 140 lines; keep it under {checks.MAX_CLAUDE_MD_LINES}",
    ]
