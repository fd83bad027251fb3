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
"""Start-up checks of a CPO run, on the driver, before Ray starts: each error says which override fixes it."""

from __future__ import annotations

import os
from collections.abc import Mapping

from treetune_recipe.cpo.config import CPOConfig
from treetune_recipe.cpo.teacher.contexts import CONTEXTS
from treetune_recipe.cpo.teacher.hint import (
    HintConfig,
    hint_question,
    hint_solution,
    mapping_text,
    shortest_hint_prompt_lengths,
)
from treetune_verl.preflight import PreflightError
from treetune_verl.rollout_health import RolloutHealthConfig
from treetune_verl.verl_compat import uses_engine_workers

CPO_ESTIMATOR = "cpo"
DEFAULT_QUESTION_KEY = HintConfig().question_key


def cpo_is_enabled(config) -> bool:
    """CPO shaping runs only when the config asks for the ``cpo`` advantage estimator (opt-in)."""
    return config.algorithm.adv_estimator == CPO_ESTIMATOR


def check_trainer_path(config) -> None:
    """The recipe's trainer, ``RayCPOTrainer``, is a ``RayPPOTrainer`` on engine workers: verl's v0 trainer path."""
    if config.trainer.get("use_v1", False):
        raise PreflightError(
            "trainer.use_v1=true selects verl's v1 trainer (PPOTrainerSync on TransferQueue), which this recipe does "
            "not support yet: RayCPOTrainer runs on the v0 path (RayPPOTrainer). Set trainer.use_v1=false (the "
            "recipe's default)."
        )
    if not uses_engine_workers(config):
        raise PreflightError(
            "The recipe runs on verl's engine workers; got trainer.use_legacy_worker_impl="
            f"{config.trainer.get('use_legacy_worker_impl', 'auto')}. Set trainer.use_legacy_worker_impl=disable."
        )


def check_cpo_config(config) -> CPOConfig:
    """Reject configurations the recipe cannot run with (no I/O); return the run's ``CPOConfig``.

    The ``cpo`` block is built and checked whatever the estimator (a GRPO run of the recipe reads its
    ``success_value``); the checks of what CPO itself needs run only with ``algorithm.adv_estimator=cpo``.

    Raises:
        PreflightError: one line per problem, naming the override that fixes it.
    """
    check_trainer_path(config)
    try:
        cpo_config = CPOConfig.from_config(config.get("cpo"))  # every cpo.* key and value, nested blocks included
    except ValueError as error:
        raise PreflightError(str(error)) from None
    if not cpo_is_enabled(config):
        return cpo_config
    if config.get("cpo") is None:
        raise PreflightError("algorithm.adv_estimator=cpo needs the top-level `cpo:` block (use config cpo_trainer).")
    if not config.actor_rollout_ref.actor.get("calculate_entropy", False):
        raise PreflightError(
            "CPO advantage wrappers read the current-policy token entropy; "
            "set actor_rollout_ref.actor.calculate_entropy=true."
        )
    check_teacher_worker(config, cpo_config)
    check_method_support(config, cpo_config)
    return cpo_config


def check_method_support(config, cpo_config: CPOConfig) -> None:
    """A distribution-level method needs verl 0.9.1's update hook (the FSDP engine hands the logits to the loss) and
    sees whole sequences (no Ulysses sequence parallelism, no fused kernels)."""
    method = cpo_config.selected_method
    if not method.distribution_level:
        return
    from treetune_verl.logits_hook import check_distribution_support

    try:
        check_distribution_support()
    except (RuntimeError, ValueError) as error:
        raise PreflightError(f"cpo.method={method.name} reads the student's logits in the update: {error}") from None
    actor, model = config.actor_rollout_ref.actor, config.actor_rollout_ref.model
    if model.get("use_fused_kernels", False):
        raise PreflightError(
            f"cpo.method={method.name} needs the student's logits in the update, which fused kernels never "
            "materialise: set actor_rollout_ref.model.use_fused_kernels=false."
        )
    if actor.get("ulysses_sequence_parallel_size", 1) != 1 or actor.get("strategy") not in ("fsdp", "fsdp2"):
        raise PreflightError(
            f"cpo.method={method.name} runs its teacher beside the student inside the update, on the FSDP engine "
            "without sequence parallelism (the logits hook would see a shard of each row): set "
            "actor_rollout_ref.actor.strategy=fsdp2 and actor_rollout_ref.actor.ulysses_sequence_parallel_size=1."
        )
    check_teacher_token_budget(config, cpo_config)


#: Float32 ``[tokens, V]`` copies one piece of a distribution-level loss holds at its peak (the two log-softmaxes,
#: the divergence's mixture and terms, their gradients), for the start-up estimate.
PIECE_COPIES = 8


def check_teacher_token_budget(config, cpo_config: CPOConfig) -> None:
    """The teacher's rows are the students' with the context's prompt: with dynamic batch sizes the longest teacher
    row (its prompt limit plus ``data.max_response_length``) must fit the actor's token budget
    (``actor.ppo_max_token_len_per_gpu``), which verl sizes each update micro-batch by. Prints what the loss then
    holds on the device beside verl's own logits: the teacher's logits at the micro-batch's response tokens (bf16 on
    a GPU) and the float32 copies of one piece of the loss (``methods.loss.CHUNK_VALUES`` values each)."""
    from treetune_recipe.cpo.methods.loss import CHUNK_VALUES

    data, actor = config.data, config.actor_rollout_ref.actor
    hint = cpo_config.teacher_context.resolve_hint(cpo_config.hint, data.max_prompt_length, data.max_response_length)
    longest = int(hint.max_prompt_length) + int(data.max_response_length)
    if actor.get("use_dynamic_bsz", False):
        budget = int(actor.ppo_max_token_len_per_gpu)
        if longest > budget:
            raise PreflightError(
                f"cpo.method={cpo_config.method}: a teacher row can hold {longest} tokens (its prompt limit "
                f"{hint.max_prompt_length}, cpo.hint.max_prompt_length, plus data.max_response_length), more than the "
                f"actor's token budget actor_rollout_ref.actor.ppo_max_token_len_per_gpu={budget} that sizes each "
                f"update micro-batch: set actor_rollout_ref.actor.ppo_max_token_len_per_gpu={longest} or more, or a "
                "lower cpo.hint.max_prompt_length."
            )
        response_tokens = budget
    else:
        response_tokens = int(actor.ppo_micro_batch_size_per_gpu or 1) * int(data.max_response_length)
    vocab = _vocabulary_size(config.actor_rollout_ref.model.path)
    if vocab is not None:
        teacher_bytes = response_tokens * vocab * 2
        piece_bytes = min(CHUNK_VALUES, response_tokens * vocab) * 4 * PIECE_COPIES
        print(
            f"[cpo] {cpo_config.method}: the teacher runs inside the update; beside the engine's own logits, each "
            f"device holds the teacher's logits at up to {response_tokens} response tokens x {vocab} ids "
            f"({teacher_bytes / 2**30:.2f} GiB in bf16) and about {piece_bytes / 2**30:.2f} GiB for one piece of the "
            "loss."
        )


def _vocabulary_size(model_path: str | None) -> int | None:
    """``vocab_size`` of a local Hugging Face model folder's ``config.json`` (None when it cannot be read here)."""
    import json

    path = os.path.join(os.path.expanduser(str(model_path or "")), "config.json")
    try:
        with open(path) as handle:
            return int(json.load(handle)["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_teacher_worker(config, cpo_config: CPOConfig) -> None:
    """A teacher read from verl's reference-policy worker needs that worker, which verl creates only for a KL term."""
    teacher = cpo_config.teacher_config.name
    # SYNC WARNING: verl/trainer/ppo/utils.py:need_reference_policy (use_kl_in_reward or actor.use_kl_loss)
    has_reference = config.algorithm.get("use_kl_in_reward", False) or config.actor_rollout_ref.actor.use_kl_loss
    if cpo_config.teacher_config.on_reference_worker and not has_reference:
        raise PreflightError(
            f"cpo.teacher resolves to {teacher!r} (cpo.method={cpo_config.method}, cpo.teacher="
            f"{cpo_config.teacher}), which the reference-policy worker scores, but this config has none: verl creates "
            "it only with actor_rollout_ref.actor.use_kl_loss=true or algorithm.use_kl_in_reward=true. Set "
            "actor_rollout_ref.actor.use_kl_loss=true (with actor_rollout_ref.actor.kl_loss_coef=0 the KL term stays "
            "out of the loss), or cpo.teacher=policy."
        )
    model = config.actor_rollout_ref.model
    # SYNC WARNING: verl/trainer/main_ppo_v0.py:TaskRunner.add_actor_rollout_worker (LoRA: the reference is the actor
    # without its adapter, no model of its own)
    lora = (model.get("lora") or {}).get("rank", 0) > 0 or model.get("lora_rank", 0) > 0
    if cpo_config.teacher_config.changes_weights and (lora or model.get("lora_adapter_path") is not None):
        raise PreflightError(
            f"cpo.teacher={teacher} changes the reference model's weights from the actor's, but with LoRA the "
            "reference is the actor without its adapter (no model of its own to change). Use cpo.teacher=initial "
            "or policy."
        )


def check_cpo_run(config, tokenizer=None) -> CPOConfig:
    """``check_cpo_config`` plus every check of the data files, before Ray starts.

    - verl's RL parquet layout on the train and validation files (every bad row listed; validation files need no
      ``ability``, no row needs ``extra_info.question``);
    - prompts longer than ``data.max_prompt_length`` while verl would neither filter nor truncate them;
    - the ``treetune.rollout_health`` thresholds of the run-health guard (every estimator);
    - the seeded agent loop only where it can seed (``treetune_verl/seeded_agent_loop.py``: vLLM, verl 0.9.1);
    - with CPO on: what the run's teacher context reads from the files (``TeacherContext.needs``), in the training
      rows. The gold solution (``gold_solution`` only): every row with ``on_missing=error``; the share of rows
      without one is printed; none at all stops unless ``cpo.hint.allow_all_missing=true``; and the hint prompt of
      the longest question fitting ``cpo.hint.max_prompt_length`` with an empty solution. Another column (the
      answer of ``answer_only``): the share of rows without it is printed, none at all stops. A context that reads
      nothing from the files (a successful sibling, the reward's feedback) has what it reads printed.

    Args:
        config: the composed run config.
        tokenizer: the actor's tokenizer; loaded from ``actor_rollout_ref.model.path`` when a check needs it.

    Returns:
        the run's ``CPOConfig``, built once here (``main_cpo`` writes it back into the config the trainer receives).

    Raises:
        PreflightError: (a ``ValueError``) listing every problem found, each naming the key, the value and the fix.
    """
    from treetune_verl.data.rl_schema import check_rl_files, overlong_prompt_problems
    from treetune_verl.rollout_seeds import configured_seeding_problem

    cpo_config = check_cpo_config(config)
    try:  # RayCPOTrainer's guard, for every estimator: the error it would raise in its actor, before Ray
        RolloutHealthConfig.from_run_config(config)
    except ValueError as error:
        raise PreflightError(str(error)) from None
    seeding_problem = configured_seeding_problem(config)
    if seeding_problem:
        raise PreflightError(seeding_problem)
    train = check_rl_files(config.data.train_files, require_solution=False, what="data.train_files")
    val = check_rl_files(config.data.val_files, require_solution=False, what="data.val_files", require_ability=False)
    data = config.data
    chat_kwargs = data.get("apply_chat_template_kwargs", None)
    check_lengths = not data.get("filter_overlong_prompts", False) and data.get("truncation", "error") == "error"
    if not (train or val) or not (check_lengths or cpo_is_enabled(config)):
        return cpo_config
    tokenizer = tokenizer if tokenizer is not None else _load_tokenizer(config)
    problems = []
    if tokenizer is not None and check_lengths:
        for what, frames in (("data.train_files", train), ("data.val_files", val)):
            problems += overlong_prompt_problems(frames, tokenizer, int(data.max_prompt_length), what, chat_kwargs)
    if cpo_is_enabled(config):
        problems += _context_data_problems(train, cpo_config, data.max_prompt_length, tokenizer, chat_kwargs)
    if problems:
        raise PreflightError(
            f"CPO start-up check found {len(problems)} problem(s) in the data:\n"
            + "\n".join(f"  - {problem}" for problem in problems)
        )
    return cpo_config


def _load_tokenizer(config):
    """The actor's tokenizer, or None when the model is not a local folder (verl downloads it later)."""
    path = os.path.expanduser(str(config.actor_rollout_ref.model.path))
    if not os.path.isdir(path):
        return None
    from verl.utils import hf_tokenizer

    trust_remote_code = config.actor_rollout_ref.model.get("trust_remote_code", False)
    return hf_tokenizer(path, trust_remote_code=trust_remote_code)


def _context_data_problems(frames, cpo_config: CPOConfig, max_prompt_length: int, tokenizer, chat_kwargs) -> list[str]:
    """Problems of the training rows for what the run's teacher context reads (``TeacherContext.needs``)."""
    context = cpo_config.teacher_context
    needs = context.needs(cpo_config)
    for item in needs.step:
        print(f"[cpo] teacher context {context.name}: reads, at each step, {item}.")
    hint = cpo_config.hint.resolve(max_prompt_length)
    problems = []
    for column in needs.columns:
        if column == f"extra_info.{hint.solution_key}":  # the hint prompt's own checks (solutions, prompt width)
            problems += _hint_data_problems(frames, hint, tokenizer, chat_kwargs)
        else:
            problems += _column_problems(frames, column, context.name)
    return problems


def _column_problems(frames, column: str, context: str) -> list[str]:
    """The training rows without ``column`` (dotted: ``reward_model.ground_truth``): their share is printed (those
    rows get no teacher context); a file where no row has it is a problem."""
    top, _, key = column.partition(".")
    problems = []
    for path, frame in frames:
        values = frame[top] if top in frame else [None] * len(frame)
        missing = sum(not mapping_text(value if isinstance(value, Mapping) else None, key) for value in values)
        print(
            f"[cpo] data.train_files: {path}: {missing} of {len(frame)} rows ({missing / max(len(frame), 1):.0%}) "
            f"have no {column} (no teacher context on those rows: cpo.context={context})."
        )
        if len(frame) and missing == len(frame):
            problems.append(
                f"data.train_files: {path}: no row has {column}, which the teacher context {context} shows, so no "
                "row would get one. Add the column, or choose another context with cpo.context="
                f"{'|'.join(name for name in CONTEXTS if name != context)}."
            )
    return problems


def _hint_data_problems(frames, hint: HintConfig, tokenizer, chat_kwargs) -> list[str]:
    """Problems of the training rows for the hint prompt; prints the share of rows without a solution."""
    problems = []
    solution_column = f"extra_info.{hint.solution_key}"
    for path, frame in frames:
        infos = [info if isinstance(info, Mapping) else {} for info in frame["extra_info"]]
        missing = [row for row, info in enumerate(infos) if not hint_solution(info, hint.solution_key)]
        print(
            f"[cpo] data.train_files: {path}: {len(missing)} of {len(infos)} rows ({len(missing) / len(infos):.0%}) "
            f"have no {solution_column} (cpo.hint.on_missing={hint.on_missing})."
        )
        if missing and hint.on_missing == "error":
            listed = ", ".join(f"row {row}" for row in missing[:10]) + (" ..." if len(missing) > 10 else "")
            problems.append(
                f"data.train_files: {path}: {solution_column} is missing or empty in {len(missing)} row(s): {listed}. "
                f"The hint prompt needs it: add the gold solutions, point cpo.hint.solution_key="
                f"{hint.solution_key} to the extra_info key that holds them, or set cpo.hint.on_missing=skip."
            )
        elif len(missing) == len(infos) and not hint.allow_all_missing:
            problems.append(
                f"data.train_files: {path}: no row has {solution_column}, so with cpo.hint.on_missing=skip every "
                "group is skipped and the run is plain GRPO. Fix cpo.hint.solution_key, run "
                "algorithm.adv_estimator=grpo, or confirm with cpo.hint.allow_all_missing=true."
            )
        if hint.question_key != DEFAULT_QUESTION_KEY and not any(hint.question_key in info for info in infos):
            print(
                f"[cpo] warning: no row of {path} has extra_info.{hint.question_key} (cpo.hint.question_key); the "
                "hint prompt uses the last user message of each prompt instead."
            )
        if tokenizer is None:
            continue
        questions = [hint_question(info, prompt, hint.question_key) for info, prompt in zip(infos, frame["prompt"])]
        lengths = shortest_hint_prompt_lengths(tokenizer, hint, questions, chat_kwargs)
        longest = max(range(len(lengths)), key=lengths.__getitem__)
        if lengths[longest] > hint.max_prompt_length:
            problems.append(
                f"cpo.hint.max_prompt_length={hint.max_prompt_length}: the hint prompt of {path} row {longest} needs "
                f"{lengths[longest]} tokens even with an empty solution. Set cpo.hint.max_prompt_length="
                f"{lengths[longest] + 256} or more (or null: data.max_prompt_length + max_prompt_length_margin), or "
                "shorten cpo.hint.system / cpo.hint.user_template."
            )
    return problems
