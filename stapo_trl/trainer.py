"""STAPOTrainer: TRL's GRPOTrainer whose loss leaves out the tokens the S2T mask silences (paper Eq. 6)."""

import os
import shutil
import textwrap
import time
from contextlib import nullcontext

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import logging
from trl import GRPOTrainer
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import get_config_model_id, nanmax, nanmin

from .config import STAPOConfig
from .diagnostics.quadrants import StepDiagnostics
from .diagnostics.trace import SpuriousTokenTracer
from .model_card import model_card
from .output_dir import describe_save_failure, hold_output_dir
from .s2t import masked_quantile, pooled_spurious_token_masks


logger = logging.get_logger(__name__)

# Entropy quantiles of the loss tokens logged every step, as in the paper's Fig. 5d.
ENTROPY_QUANTILES = {"p50": 0.5, "p80": 0.8, "p95": 0.95}
# Inputs besides the token ids that the policy's forward takes (multimodal models), as GRPOTrainer passes them.
MODEL_INPUT_KEYS = (
    "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles",
    "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids",
)  # fmt: skip
# Those of them that are per image rather than per row: a micro-batch holding them cannot be cut into rows.
IMAGE_INPUT_KEYS = tuple(key for key in MODEL_INPUT_KEYS if key not in ("token_type_ids", "mm_token_type_ids"))
# What the pre-pass packs row by row: the token tensors and the per-row model inputs.
ROW_KEYS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "token_type_ids", "mm_token_type_ids")


class STAPOTrainer(GRPOTrainer):
    """
    Trainer for STAPO (Spurious-Token-Aware Policy Optimization), from "STAPO: Stabilizing Reinforcement Learning for
    LLMs by Silencing Rare Spurious Tokens" (2026). A drop-in replacement of [`~trl.GRPOTrainer`] configured by
    [`STAPOConfig`].

    The S2T mask ([`~stapo_trl.s2t.spurious_token_mask`]) picks the spurious tokens: low-probability (< τ_p),
    low-entropy (< τ_h, the q-quantile of the candidates' entropies) tokens of positive-advantage completions. They are
    removed from the loss mask, so they get no gradient and are not counted by the normalizer, and every metric of
    "loss tokens" (entropy, clip ratios) sees the same tokens as the loss.

    Scope. With `spurious_mask_scope="step"` (default; the paper's "each mini-batch") the decision is taken once per
    optimizer step, in `_prepare_inputs` at the step's first micro-batch, before any backward: over every micro-batch
    of the step on every process, from log π_θ and H under the step's weights (which do not change within a step). They
    come from TRL's own no-grad forward of the old log-probabilities where that ran at the same weights (the first
    step of each generation batch, when `steps_per_generation > gradient_accumulation_steps`, `num_iterations > 1`
    or vLLM importance sampling makes TRL run it; the fused LM head computes the entropies there anyway), and
    otherwise from a no-grad forward of the step's positive-advantage completions only (the only ones that can hold a
    candidate), packed into forwards of `per_device_train_batch_size` rows, keeping only the per-token
    log-probabilities and entropies. With one micro-batch per optimizer step (`gradient_accumulation_steps=1`) that
    micro-batch's loss takes the step's decision itself, from its own forward. With `"micro_batch"` each micro-batch
    decides alone inside its loss (pooled over processes), from the loss's own forward. Modes without τ_h (`"all"`,
    `"random"`) decide each token alone: they need the step's values ahead of its backward only for the DAPO
    normalizer's silenced count, so with the other loss types they decide inside each micro-batch's loss. The entropy
    quantiles of the loss tokens are logged from the loss forwards, once per decision.

    Normalization. With `loss_type="dapo"`, a micro-batch's loss is its sum over unsilenced tokens divided by TRL's
    normalizer scaled by the keep ratio (L - S) / L, where L and S count the loss and silenced tokens of the decision's
    pool: the whole optimizer step on all processes (scope "step"), or the micro-batch on all processes
    ("micro_batch"). TRL's normalizer is the generation batch's loss-token count per optimizer step,
    `num_items_in_batch x gradient_accumulation_steps / steps_per_generation`. So, in scope "step":

    - when `steps_per_generation == gradient_accumulation_steps` (one optimizer step per generation batch, any
      `num_iterations`), TRL's count is the step's own L and the step's gradient is exactly Eq. 6 over its completions,
      for any `per_device_train_batch_size`, `gradient_accumulation_steps` and number of processes;
    - when `steps_per_generation > gradient_accumulation_steps`, TRL divides every step by the generation batch's mean
      count per step, so step j's gradient is Eq. 6's times L_j / mean(L), for the baseline as much as for STAPO: about
      1 ± 0.03 (standard deviation) with the Qwen3-1.7B recipe's layout, 1 ± 0.10 with the one-GPU LoRA recipe's
      (simulated with long-tailed completion lengths by `benchmarks/normalizer_scale.py`).

    In scope "micro_batch" each micro-batch is renormalized by its own silenced share s_k instead of the step's s:
    micro-batch k is weighted by (1 - s) / (1 - s_k) relative to the above, and τ_h depends on the split. The other
    loss types normalize by the loss mask itself (`grpo`, `bnpo`) or by a constant (`dr_grpo`), so removing tokens
    from the mask renormalizes them as their definitions say (with their own per-micro-batch means).

    `top_entropy_quantile < 1` (20-Entropy) is applied after S2T, over the tokens S2T kept.
    """

    _tag_names = ["trl", "grpo", "stapo"]
    _name = "STAPO"
    _paper = {
        "title": "STAPO: Stabilizing Reinforcement Learning for LLMs by Silencing Rare Spurious Tokens",
        "id": None,
        # docstyle-ignore
        "citation": textwrap.dedent("""\
            @article{stapo2026,
                title        = {{STAPO: Stabilizing Reinforcement Learning for LLMs by Silencing Rare Spurious Tokens}},
                year         = 2026,
            }"""),
    }

    def __init__(self, model, reward_funcs=None, args: STAPOConfig | None = None, *other_args, **kwargs):
        if args is not None and not isinstance(args, STAPOConfig):
            raise TypeError(
                f"STAPOTrainer needs `args` to be a STAPOConfig (it holds τ_p, q and the mask mode), got "
                f"{type(args).__name__}. Build it with STAPOConfig(**your_grpo_config.to_dict()) or use GRPOTrainer."
            )
        if args is None:
            model_name = model if isinstance(model, str) else get_config_model_id(model.config)
            args = STAPOConfig(f"{model_name.split('/')[-1]}-STAPO")
        # FSDP1 + vLLM: TRL's weight sync walks the model as it was before FSDP wrapping, where the parameters of
        # the root FSDP unit (embeddings, final norm, output layer) are not inside any FSDP module, so vLLM would keep
        # their initial values, silently. The FSDP version comes from the config's fsdp_config, else from accelerate.
        fsdp_version = (args.fsdp_plugin_args or {}).get("fsdp_version")
        if fsdp_version is None and os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
            fsdp_version = int(os.environ.get("FSDP_VERSION", "1"))  # accelerate's default version is 1
        if args.use_vllm and fsdp_version == 1:
            raise ValueError(
                "use_vllm=True does not work with FSDP1 (fsdp_version: 1): TRL's weight sync would never send vLLM "
                "the parameters of the root FSDP unit (embeddings, final norm, output layer), so generation would "
                "keep their initial values. Use FSDP2 (fsdp_version: 2, e.g. examples/accelerate_configs/fsdp2.yaml), "
                "DeepSpeed ZeRO-3, or use_vllm=False."
            )
        super().__init__(model, reward_funcs, args, *other_args, **kwargs)
        if fsdp_version is not None and not self.is_fsdp_enabled and self.accelerator.is_main_process:
            # accelerate enables FSDP only on GPUs and other accelerators; elsewhere it drops it without a word.
            logger.warning(
                f"FSDP (fsdp_version {fsdp_version}) was asked for, but accelerate runs this job as "
                f"{self.accelerator.distributed_type.value} without FSDP: every process holds and trains the whole "
                "model (DDP when there are several)."
            )
        if args.disable_dropout:  # TRL zeroes the nn.Dropout modules; attention reads its rate from a float
            for module, attribute, _ in _dropout_rates(self.model, self.ref_model):
                setattr(module, attribute, 0.0)
        active = [f"{attribute}={rate}" for _, attribute, rate in _dropout_rates(self.model) if rate > 0]
        if active and self._decides_per_step:
            raise ValueError(
                f"Dropout is active ({', '.join(sorted(set(active)))}) with disable_dropout=False: "
                "spurious_mask_scope='step' decides the step's silenced tokens from a forward pass of its own, whose "
                "dropout masks differ from the loss's, so the decision would not be Eq. 6's for the loss. Set "
                "disable_dropout=True (the default; the paper trains without dropout), or "
                "spurious_mask_scope='micro_batch', or gradient_accumulation_steps=1 (the loss's forward decides)."
            )
        if self.accelerator.is_main_process:  # one run at a time in output_dir, for this process's life
            hold_output_dir(args.output_dir)
        self._random_mask_generator = None
        self._captured_forwards = None  # (log-probs, entropies) of TRL's no-grad forwards during a generation
        self._old_forward_step = None  # global step at which TRL's old-log-prob forward last ran
        self._step_inputs = None  # the micro-batches of the current optimizer step, with the step's S2T decision
        self._pool_entropies = []  # (entropies, loss mask) of the loss forwards of the current decision so far
        self._micro_batch_decisions = []  # scope "micro_batch": the step's decisions so far, logged at its end
        self._tracer = None
        if args.spurious_trace:
            self._tracer = SpuriousTokenTracer(
                args.output_dir,
                self.accelerator.process_index,
                self.processing_class,
                temperature=args.temperature,
                max_silenced=args.spurious_trace_max_silenced,
                max_kept=args.spurious_trace_max_kept,
                context_tokens=args.spurious_trace_context_tokens,
                top_k=args.spurious_trace_top_k,
            )
        multi_process = self.accelerator.num_processes > 1
        self._step_diagnostics = StepDiagnostics(
            mechanism=args.spurious_mechanism_metrics,
            prob_threshold=args.spurious_prob_threshold,
            entropy_quantile=args.spurious_entropy_quantile,
            epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high,
            temperature=self.temperature,
            gather=self._gather_entropies if multi_process else None,
            reduce=(lambda tensor: self.accelerator.reduce(tensor, reduction="sum")) if multi_process else None,
            model_config=self.model.config,
        )

    def _gather_entropies(self, entropies: torch.Tensor) -> torch.Tensor:
        """All-gather a variable-length 1-D tensor of entropies (>= 0) from every process."""
        pad_value = -1e9  # entropies are never negative, so the sentinel cannot collide with a real value
        gathered = self.accelerator.gather(
            self.accelerator.pad_across_processes(entropies, dim=0, pad_index=pad_value)
        )
        return gathered[gathered != pad_value]

    def _spurious_mask_and_log(self, model, inputs, per_token_logps, entropies, advantages, mask, mode: str):
        """Decide the S2T mask over one pool of tokens, log its metrics, and return (silenced, loss-token keep ratio).

        The pool is one micro-batch (tensors) or the micro-batches of one optimizer step (lists of tensors, then
        `silenced` is a list too); in both cases it spans every process. The keep ratio (L - S) / L counts the loss
        tokens L and silenced tokens S of the whole pool on all processes. Only the tokens of positive-advantage
        completions are read from `per_token_logps` and `entropies` (the step's pre-pass leaves the others NaN);
        the entropy quantiles of all loss tokens are logged by `_log_entropy_quantiles`, from the loss forwards.
        """
        args = self.args
        pooled = isinstance(per_token_logps, list)
        if not pooled:  # one micro-batch: a pool of one
            inputs, per_token_logps, entropies = [inputs], [per_token_logps], [entropies]
            advantages, mask = [advantages], [mask]
        timer = _Timer(per_token_logps[0].device)
        if args.spurious_mask_mode == "random" and self._random_mask_generator is None:
            self._random_mask_generator = torch.Generator(device=per_token_logps[0].device)
            self._random_mask_generator.manual_seed(args.seed + self.accelerator.process_index)
        multi_process = self.accelerator.num_processes > 1
        silenced, candidates, entropy_threshold = pooled_spurious_token_masks(
            per_token_logps,
            entropies,
            advantages,
            mask,
            prob_threshold=args.spurious_prob_threshold,
            entropy_quantile=args.spurious_entropy_quantile,
            mode=args.spurious_mask_mode,
            generator=self._random_mask_generator,
            gather=self._gather_entropies if multi_process else None,
            return_details=True,
        )
        timer.stop()
        counts = torch.stack(
            [sum(m.sum() for m in mask), sum(c.sum() for c in candidates), sum(s.sum() for s in silenced)]
        )
        totals = self.accelerator.reduce(counts.float(), reduction="sum") if multi_process else counts.float()
        num_loss, num_silenced = totals[0], totals[2]
        keep_ratio = (num_loss - num_silenced).clamp(min=1.0) / num_loss.clamp(min=1.0)

        # Everything logged comes to the host in one read.
        num_loss_, num_candidates_, num_silenced_, threshold_ = torch.cat(
            [totals, entropy_threshold.reshape(1).float()]
        ).tolist()
        metrics = self._metrics[mode]
        metrics["spurious/mask_time_ms"].append(timer.milliseconds())
        decision = (num_loss_, num_candidates_, num_silenced_, threshold_)
        if not pooled and mode == "train" and self.current_gradient_accumulation_steps > 1:
            # Scope "micro_batch": several decisions per optimizer step, logged once per step with the step's totals
            # (a mean over micro-batches would log 13 silenced tokens as 3.25); the step has no single threshold.
            self._micro_batch_decisions.append(decision)
            if (self._step + 1) % self.current_gradient_accumulation_steps == 0:
                self._log_decision(metrics, self._micro_batch_decisions)
                self._micro_batch_decisions = []
        else:
            self._log_decision(metrics, [decision])
        if self._tracer is not None and mode == "train":  # step: the optimizer step being built, as in the logs
            for index in range(len(inputs)):
                self._tracer.record(
                    self.state.global_step + 1, self._step + index, model, inputs[index],
                    per_token_logps[index].detach(), entropies[index].detach(), _per_row(advantages[index]),
                    silenced[index], candidates[index], entropy_threshold,
                )  # fmt: skip
        return (silenced if pooled else silenced[0]), keep_ratio

    def _log_entropy_quantiles(self, entropies, mask, mode: str, pool_size: int):
        """Log the entropy quantiles of one decision's loss tokens (paper Fig. 5d), from the loss forwards.

        Called by every micro-batch's loss; the quantiles are taken once the decision's `pool_size` micro-batches have
        come through, over the values of every process (not a mean of quantiles).
        """
        self._pool_entropies.append((entropies.detach().reshape(-1).float(), mask.reshape(-1).bool()))
        if len(self._pool_entropies) < pool_size:
            return
        values, valid = (torch.cat(parts) for parts in zip(*self._pool_entropies, strict=True))
        self._pool_entropies = []
        if self.accelerator.num_processes > 1:
            values = self._gather_entropies(values[valid])
            valid = torch.ones_like(values, dtype=torch.bool)
        quantiles = masked_quantile(values, valid, list(ENTROPY_QUANTILES.values())).tolist()
        for name, quantile in zip(ENTROPY_QUANTILES, quantiles, strict=True):
            self._metrics[mode][f"entropy/{name}"].append(quantile)

    @staticmethod
    def _log_decision(metrics, decisions):
        """Log the S2T counts of one optimizer step from its decisions, each (loss tokens, candidates, silenced, τ_h):
        one decision over the step, or one per micro-batch (scope "micro_batch"), whose thresholds are averaged under
        their own name."""
        num_loss, num_candidates, num_silenced = (sum(decision[i] for decision in decisions) for i in range(3))
        metrics["spurious/silenced_ratio"].append(num_silenced / max(num_loss, 1.0))
        metrics["spurious/candidate_ratio"].append(num_candidates / max(num_loss, 1.0))
        metrics["spurious/silenced_count"].append(num_silenced)
        if len(decisions) == 1:
            metrics["spurious/entropy_threshold"].append(decisions[0][3])
        else:
            thresholds = [decision[3] for decision in decisions if decision[3] == decision[3]]  # NaN: no candidate
            mean = sum(thresholds) / len(thresholds) if thresholds else float("nan")
            metrics["spurious/entropy_threshold_micro_batch_mean"].append(mean)

    # --- S2T per optimizer step (spurious_mask_scope="step") ---
    # Transformers' loop calls `_prepare_inputs` once per micro-batch, in order, before that micro-batch's forward;
    # GRPOTrainer hands out slices of its buffered generation batch there. At the first micro-batch of an optimizer
    # step every slice of the step is in that buffer (STAPOConfig makes generations start at step boundaries), and the
    # weights are those every micro-batch of the step will see, so the step's decision is taken there.

    @property
    def _decides_per_step(self) -> bool:
        # With one micro-batch per optimizer step, the decision inside its loss (over all processes) is the step's
        # already: no decision ahead of it, and no extra forward. Modes without τ_h ("all", "random") decide each
        # token alone, so only the DAPO normalizer needs the step's silenced count before the first backward; with
        # the other loss types they decide inside each micro-batch's loss, at no extra forward.
        args = self.args
        pools_tokens = args.spurious_mask_mode in ("low_entropy", "high_entropy") or args.loss_type == "dapo"
        return (
            args.spurious_mask_scope == "step"
            and args.spurious_mask_mode != "none"
            and pools_tokens
            and args.gradient_accumulation_steps > 1
        )

    def _prepare_inputs(self, generation_batch):
        inputs = super()._prepare_inputs(generation_batch)
        if not (self._decides_per_step and self.model.training):
            return inputs
        position = self._step % self.args.gradient_accumulation_steps
        if position == 0:
            buffer, steps_per_generation = self._buffered_inputs, self.args.steps_per_generation
            step = [
                buffer[(self._step + j) % steps_per_generation]
                for j in range(self.current_gradient_accumulation_steps)
            ]
            self._step_inputs = self._decide_step(step)
        return self._step_inputs[position]

    def _decide_step(self, micro_batches: list[dict]) -> list[dict]:
        """The S2T decision of one optimizer step, from its micro-batches (this process's share), before any backward.

        Needs log π_θ and H of the step's candidates under the step's weights. Where TRL's no-grad forward of the old
        log-probabilities ran at these same weights (the first optimizer step of a generation batch, when TRL runs
        that forward at all), its values are used; otherwise `_no_grad_logps_and_entropies` forwards the step's
        positive-advantage completions. Returns the micro-batches with the decision attached.
        """
        reuse = self._old_forward_step == self.state.global_step and all(
            "old_per_token_entropies" in micro_batch for micro_batch in micro_batches
        )
        if reuse:
            logps = [micro_batch["old_per_token_logps"] for micro_batch in micro_batches]
            entropies = [micro_batch["old_per_token_entropies"] for micro_batch in micro_batches]
        else:
            logps, entropies = self._no_grad_logps_and_entropies(micro_batches)
        masks = [_loss_mask(micro_batch) for micro_batch in micro_batches]
        advantages = [_per_row(micro_batch["advantages"]) for micro_batch in micro_batches]
        silenced, keep_ratio = self._spurious_mask_and_log(
            self.model, micro_batches, logps, entropies, advantages, masks, "train"
        )
        self._pool_entropies = []  # the step's loss forwards log its entropy quantiles
        return [
            {**micro_batch, "spurious_silenced": mb_silenced, "spurious_keep_ratio": keep_ratio,
             "spurious_pool_size": len(micro_batches)}
            for micro_batch, mb_silenced in zip(micro_batches, silenced, strict=True)
        ]  # fmt: skip

    def _no_grad_logps_and_entropies(self, micro_batches: list[dict]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """log π_θ and H of the step's tokens that can be candidates, as the loss will compute them, without a graph.

        Only completions with Â > 0 can hold a candidate, and τ_h is a quantile of the candidates' entropies, so only
        they are forwarded: their rows from every micro-batch of the step, packed into forwards of
        `per_device_train_batch_size` rows. Rows are packed only with rows of the same padded shape (all the
        micro-batches of a generation batch share one), so each keeps the padding, and positions, of its loss forward;
        a micro-batch with images is forwarded whole (its image tensors are not per row). The other rows are NaN.
        Every process runs as many forwards as the one with the most, adding one-token forwards where it has fewer:
        under FSDP or ZeRO-3 each forward is a collective.
        """
        batch_size = self.args.per_device_train_batch_size
        logps = [torch.full_like(mb["completion_ids"], torch.nan, dtype=torch.float32) for mb in micro_batches]
        entropies = [torch.full_like(values, torch.nan) for values in logps]
        groups = {}  # packing key -> [(micro-batch index, its rows to forward)]
        for index, micro_batch in enumerate(micro_batches):
            rows = (_per_row(micro_batch["advantages"]) > 0).any(dim=1).nonzero().squeeze(1)
            if rows.numel() == 0:
                continue
            if any(micro_batch.get(key) is not None for key in IMAGE_INPUT_KEYS):
                groups[index] = [(index, torch.arange(micro_batch["prompt_ids"].size(0), device=rows.device))]
            else:
                shape = (micro_batch["prompt_ids"].shape, micro_batch["completion_ids"].shape)
                groups.setdefault(shape, []).append((index, rows))
        # Known before any forward, so that the count's collective precedes every process's first forward.
        num_forwards = sum(-(-sum(rows.numel() for _, rows in parts) // batch_size) for parts in groups.values())
        most = num_forwards
        if self.accelerator.num_processes > 1:
            most = int(self.accelerator.gather(torch.tensor([num_forwards], device=logps[0].device)).max())
        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            for parts in groups.values():
                first = micro_batches[parts[0][0]]
                packed = {
                    key: torch.cat([micro_batches[index][key][rows] for index, rows in parts])
                    for key in ROW_KEYS
                    if first.get(key) is not None
                }
                image_inputs = {key: first.get(key) for key in IMAGE_INPUT_KEYS}  # a whole micro-batch's, or none
                group_logps, group_entropies, _ = self._get_per_token_logps_and_entropies(
                    self.model,
                    torch.cat([packed["prompt_ids"], packed["completion_ids"]], dim=1),
                    torch.cat([packed["prompt_mask"], packed["completion_mask"]], dim=1),
                    packed["completion_ids"].size(1),
                    batch_size=batch_size,
                    compute_entropy=True,
                    token_type_ids=packed.get("token_type_ids"),
                    mm_token_type_ids=packed.get("mm_token_type_ids"),
                    **image_inputs,
                )
                sizes = [rows.numel() for _, rows in parts]
                for (index, rows), part_logps, part_entropies in zip(
                    parts, group_logps.split(sizes), group_entropies.split(sizes), strict=True
                ):
                    logps[index][rows], entropies[index][rows] = part_logps, part_entropies
            last_prompt_token = micro_batches[0]["prompt_ids"][:1, -1:]  # prompts are left-padded: a real token
            for _ in range(most - num_forwards):
                self._get_per_token_logps_and_entropies(
                    self.model, last_prompt_token, torch.ones_like(last_prompt_token), 1
                )
        return logps, entropies

    def _generate_and_score_completions(self, inputs):
        # When TRL runs its no-grad forward for the old log-probabilities, keep the entropies it computes alongside
        # (the fused LM head computes them anyway), so that the first step of this generation batch needs no forward.
        if not (self._decides_per_step and self.model.training):
            return super()._generate_and_score_completions(inputs)
        self._captured_forwards = []
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            captured, self._captured_forwards = self._captured_forwards, None
        for logps, entropies in captured:
            if logps is output.get("old_per_token_logps"):
                output["old_per_token_entropies"] = entropies
                self._old_forward_step = self.state.global_step
        return output

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                                           compute_entropy=False, **kwargs):  # fmt: skip
        capture = self._captured_forwards is not None and model is self.model and not compute_entropy
        # The loss's forward (the one with a graph) keeps its final hidden states for the mechanism metrics.
        diagnose = self._step_diagnostics.mechanism and torch.is_grad_enabled() and self.model.training
        with self._step_diagnostics.capture(self.accelerator.unwrap_model(model)) if diagnose else nullcontext():
            logps, entropies, aux_loss = super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy or capture, **kwargs
            )
        if capture:
            self._captured_forwards.append((logps, entropies))
            entropies = None
        return logps, entropies, aux_loss

    # The body below is GRPOTrainer._compute_loss of TRL 1.16 (the pinned range) restricted to what STAPOConfig
    # accepts, with the S2T mask inserted where marked. tests/test_trainer.py checks parity with the parent.
    def _compute_loss(self, model, inputs):
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)
        mask = _loss_mask(inputs)

        per_token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            **{key: inputs.get(key) for key in MODEL_INPUT_KEYS},
        )
        mode = "train" if self.model.training else "eval"
        advantages = inputs["advantages"]
        if advantages.dim() == 1:
            advantages = advantages.unsqueeze(1)

        # --- S2T: silenced tokens leave the loss mask (no gradient, not counted) ---
        if "spurious_silenced" in inputs:  # decided for the whole optimizer step by _decide_step
            silenced, keep_ratio = inputs["spurious_silenced"], inputs["spurious_keep_ratio"]
        else:  # decided over this micro-batch (on all processes)
            silenced, keep_ratio = self._spurious_mask_and_log(
                model, inputs, per_token_logps, entropies, advantages, mask, mode
            )
        self._log_entropy_quantiles(entropies, mask, mode, inputs.get("spurious_pool_size", 1))
        mask = mask * ~silenced

        if self.top_entropy_quantile < 1.0:
            entropy_mask = self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)
        else:
            entropy_mask = None

        old_per_token_logps = inputs.get("old_per_token_logps")
        old_per_token_logps = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps

        if self.off_policy_mask_threshold is not None:
            sampling_per_token_logps = inputs.get("sampling_per_token_logps", old_per_token_logps)
            off_policy_mask = self.get_off_policy_mask(
                advantages=advantages,
                per_token_logps=per_token_logps,
                sampling_per_token_logps=sampling_per_token_logps,
                mask=mask,
                off_policy_threshold=self.off_policy_mask_threshold,
            )

        # Token-level importance sampling only (STAPOConfig refuses the sequence level)
        coef_1 = torch.exp(per_token_logps - old_per_token_logps)
        if self.model.training:
            self._record_step_diagnostics(inputs, per_token_logps, entropies, advantages, silenced, coef_1)

        if self.beta != 0.0:
            ref_per_token_logps = inputs["ref_per_token_logps"]
            per_token_kl = (
                torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1
            )
            if self.args.use_bias_correction_kl:
                per_token_kl = per_token_kl * coef_1

        # Clipped surrogate with clip-higher: min(ρ Â, clip(ρ, 1 - ε_low, 1 + ε_high) Â)
        coef_2 = torch.clamp(coef_1, 1 - self.epsilon_low, 1 + self.epsilon_high)
        if self.args.delta is not None:
            coef_1 = torch.clamp(coef_1, max=self.args.delta)
        per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)

        if self.off_policy_mask_threshold is not None:
            per_token_loss = per_token_loss * off_policy_mask
        if entropy_mask is not None:
            per_token_loss = per_token_loss * entropy_mask
        if self.use_vllm and self.vllm_importance_sampling_correction:
            per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]
        if self.beta != 0.0:
            per_token_loss = per_token_loss + self.beta * per_token_kl

        accumulation_steps = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        if self.loss_type == "dapo":
            normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            if mode == "train":
                normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation
            # --- S2T: the normalizer counts only unsilenced tokens (see the class docstring) ---
            loss = (per_token_loss * mask).sum() / (normalizer * keep_ratio)
        elif self.loss_type == "grpo":
            loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / accumulation_steps
        elif self.loss_type == "bnpo":
            loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0) / accumulation_steps
        else:  # dr_grpo
            loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * self.max_completion_length)
            loss = loss / accumulation_steps

        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss / accumulation_steps
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())

        def masked_seq_mean(x):
            return (x * mask).sum(-1) / mask.sum(-1)

        def global_masked_mean(x):
            totals = self.accelerator.reduce(torch.stack([(x * mask).sum(), mask.sum().float()]), reduction="sum")
            return (totals[0] / totals[1].clamp(min=1.0)).item()

        if self.beta != 0.0:
            self._metrics[mode]["kl"].append(global_masked_mean(per_token_kl))
        self._metrics[mode]["entropy"].append(global_masked_mean(entropies))

        is_low_clipped = (coef_1 < 1 - self.epsilon_low) & (advantages < 0)
        is_high_clipped = (coef_1 > 1 + self.epsilon_high) & (advantages > 0)
        is_region_clipped = is_low_clipped | is_high_clipped
        self._metrics[mode]["clip_ratio/low_mean"].append(global_masked_mean(is_low_clipped.float()))
        self._metrics[mode]["clip_ratio/high_mean"].append(global_masked_mean(is_high_clipped.float()))
        self._metrics[mode]["clip_ratio/region_mean"].append(global_masked_mean(is_region_clipped.float()))
        gathered_low_clip = self.accelerator.gather(masked_seq_mean(is_low_clipped.float()))
        self._metrics[mode]["clip_ratio/low_min"].append(nanmin(gathered_low_clip).item())
        gathered_high_clip = self.accelerator.gather(masked_seq_mean(is_high_clipped.float()))
        self._metrics[mode]["clip_ratio/high_max"].append(nanmax(gathered_high_clip).item())
        return loss

    def _record_step_diagnostics(self, inputs, per_token_logps, entropies, advantages, silenced, ratio):
        """Table 1 of the step and the vLLM log-prob gap (`stapo_trl.diagnostics.quadrants`), logged at its end."""
        old_per_token_logps = inputs.get("old_per_token_logps")
        step_metrics = self._step_diagnostics.record(
            inputs, per_token_logps, entropies, advantages, _loss_mask(inputs), silenced, ratio,
            per_token_logps if old_per_token_logps is None else old_per_token_logps,
            last_of_step=(self._step + 1) % self.current_gradient_accumulation_steps == 0,
        )  # fmt: skip
        for name, value in (step_metrics or {}).items():
            self._metrics["train"][name].append(value)

    # --- Saving: the model card with the S2T settings, and checkpoints that are complete or absent ---

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """Write `<output_dir>/README.md`: the method, its S2T settings and, when an evaluation summary lies in
        `output_dir`, its table (`stapo_trl.model_card`)."""
        if not self.is_world_process_zero():
            return
        tags = [tags] if isinstance(tags, str) else list(tags or [])
        card = model_card(
            self.args,
            base_model=get_config_model_id(self.model.config),
            model_name=model_name or os.path.basename(os.path.normpath(self.args.output_dir)),
            hub_model_id=self.hub_model_id or self.args.output_dir,
            dataset_name=dataset_name,
            tags=sorted(set(tags) | set(self._tag_names)),
            trainer_name=self._name,
            paper=self._paper,
        )
        card.save(os.path.join(self.args.output_dir, "README.md"))

    def _save_checkpoint(self, model, trial):
        """Trainer's checkpoint save. When it fails (disk full, no permission), the partial `checkpoint-N` folder is
        removed, so that nothing resumes from it, and the error names the folder and the reason."""
        run_dir = self._get_output_dir(trial=trial)
        checkpoint = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        try:
            super()._save_checkpoint(model, trial)
        except Exception as error:  # torch.save reports a full disk as a RuntimeError, safetensors as its own type
            if self.args.should_save:
                shutil.rmtree(checkpoint, ignore_errors=True)
            raise OSError(describe_save_failure(checkpoint, error)) from error


def _dropout_rates(*models):
    """(module, attribute, rate) of every dropout rate in `models` (None skipped): `p` of the nn.Dropout modules,
    and the float rates that attention implementations pass to their kernels in training (`attention_dropout`)."""
    for model in models:
        for module in model.modules() if model is not None else ():
            if isinstance(module, torch.nn.Dropout):
                yield module, "p", module.p
            for attribute, value in vars(module).items():
                if "dropout" in attribute and isinstance(value, float):
                    yield module, attribute, value


def _loss_mask(inputs) -> torch.Tensor:
    """The tokens that enter the loss: completion tokens that are not tool output."""
    mask = inputs["completion_mask"]
    return mask if "tool_mask" not in inputs else mask * inputs["tool_mask"]


def _per_row(advantages: torch.Tensor) -> torch.Tensor:
    return advantages.unsqueeze(1) if advantages.dim() == 1 else advantages


class _Timer:
    """Wall time of device work: CUDA events on a GPU (read after a later sync, so timing adds none), else a clock."""

    def __init__(self, device: torch.device):
        self.events = None
        if device.type == "cuda":
            self.events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self.events[0].record()
        else:
            self.start = time.perf_counter()

    def stop(self):
        if self.events is not None:
            self.events[1].record()
        else:
            self.elapsed = time.perf_counter() - self.start

    def milliseconds(self) -> float:
        if self.events is not None:
            return self.events[0].elapsed_time(self.events[1])  # the metrics' .item() calls have synced already
        return self.elapsed * 1000.0
