"""Test-only CPU stand-in for TRL's colocated weight sync to vLLM (what TRL does on a GPU, done the way vLLM's CPU build
accepts it). Never part of the package: on a GPU, TRL's own `VLLMGeneration.sync_weights` is what runs.

On a GPU, TRL 1.16 pushes the trainer's parameters one at a time through `model_runner.model.load_weights`. vLLM's CPU
build repacks its linear weights for its CPU kernels after loading, and the repacked parameters have no
`weight_loader` ("AttributeError: 'Parameter' object has no attribute 'weight_loader'"), so that path cannot work on
a CPU. vLLM's in-place reload takes checkpoint-format weights and repacks them again:

1. `model_runner.reload_weights(weights_iterator=..., is_checkpoint_format=True)` with the same (name, tensor) pairs
   TRL's `_iter_named_params` yields (gathered, PEFT-merged, renamed exactly as on a GPU);
2. the tied output layer: the trainer yields the shared embedding once (as vLLM requires), so the reload loads nothing
   into `lm_head` and leaves its kernel state as it was. Where vLLM's CPU matrix-multiply dispatch packs a copy of the
   weight (its sgl-kernel path on AMX CPUs), that copy would keep the old output layer; its quantization method
   processes it again here from the freshly loaded embedding. (On a CPU without AMX, vLLM's oneDNN path, the
   vLLM/trainer log-prob gap measured the same, about 1e-3, with and without this step.)
3. `reset_prefix_cache()`, as TRL does, so no cached prompt state from the old weights is reused.
"""

from trl.generation.vllm_generation import VLLMGeneration


def sync_weights_on_cpu(self: VLLMGeneration) -> None:
    """`VLLMGeneration.sync_weights` for a colocated vLLM on the CPU (replaces TRL's per-parameter load)."""
    if self.mode != "colocate":
        raise NotImplementedError("the CPU weight sync stands in for the colocated engine only")
    model_runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
    model_runner.reload_weights(weights_iterator=self._iter_named_params(), is_checkpoint_format=True)
    vllm_model = model_runner.get_model()
    if vllm_model.config.tie_word_embeddings:
        lm_head = vllm_model.lm_head
        lm_head.quant_method.process_weights_after_loading(lm_head)
    self.llm.reset_prefix_cache()


def install() -> None:
    """Route TRL's colocated weight sync through `sync_weights_on_cpu` (in this process only)."""
    VLLMGeneration.sync_weights = sync_weights_on_cpu
