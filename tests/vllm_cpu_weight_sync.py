"""Test-only CPU stand-in for TRL's colocated weight sync to vLLM, used only where TRL's own cannot work on a CPU.
Never part of the package: on a GPU, TRL's `VLLMGeneration.sync_weights` is what runs.

TRL 1.16 pushes the trainer's parameters one at a time through `model_runner.model.load_weights` into vLLM's
parameters. After loading, vLLM's CPU build hands each linear layer to its CPU matrix-multiply dispatch
(`dispatch_cpu_unquantized_gemm`), which, where oneDNN accepts the weight, keeps a packed copy and replaces the
parameter by an empty one without a `weight_loader`: TRL's next load then fails ("AttributeError: 'Parameter' object
has no attribute 'weight_loader'"). Where oneDNN refuses (on the AVX2-only CI machine it refuses bf16 weights), vLLM
keeps plain weights and TRL's own sync runs unchanged, so the tests exercise the GPU code path. Where the weights were
packed, vLLM's in-place reload, which takes checkpoint-format weights and packs them again, stands in:

1. `model_runner.reload_weights(weights_iterator=..., is_checkpoint_format=True)` with the same (name, tensor) pairs
   TRL's `_iter_named_params` yields (gathered, PEFT-merged, renamed exactly as on a GPU);
2. the tied output layer: the trainer yields the shared embedding once (as vLLM requires), so the reload loads nothing
   into `lm_head` and leaves its kernel state (a packed copy of the old weight, if any) as it was; its quantization
   method processes it again from the freshly loaded embedding;
3. `reset_prefix_cache()`, as TRL does, so no cached prompt state from the old weights is reused.
"""

import torch
from trl.generation.vllm_generation import VLLMGeneration


trl_sync_weights = VLLMGeneration.sync_weights


def weights_packed(vllm_model: torch.nn.Module) -> bool:
    """Whether vLLM's CPU build replaced some layer's weight by an empty parameter (it keeps a packed copy instead)."""
    return any(
        isinstance(getattr(module, "weight", None), torch.nn.Parameter) and module.weight.numel() == 0
        for module in vllm_model.modules()
    )


def sync_weights_on_cpu(self: VLLMGeneration) -> None:
    """`VLLMGeneration.sync_weights` for a colocated vLLM on the CPU: TRL's own, or vLLM's reload where it cannot work."""
    if self.mode != "colocate":
        raise NotImplementedError("the CPU weight sync stands in for the colocated engine only")
    model_runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
    vllm_model = model_runner.get_model()
    packed = weights_packed(vllm_model)
    print(f"weight sync: {'vLLM reload (packed CPU weights)' if packed else 'TRL'}", flush=True)
    if not packed:
        return trl_sync_weights(self)
    model_runner.reload_weights(weights_iterator=self._iter_named_params(), is_checkpoint_format=True)
    if vllm_model.config.tie_word_embeddings:
        lm_head = vllm_model.lm_head
        lm_head.quant_method.process_weights_after_loading(lm_head)
    self.llm.reset_prefix_cache()


def install() -> None:
    """Route TRL's colocated weight sync through `sync_weights_on_cpu` (in this process only)."""
    VLLMGeneration.sync_weights = sync_weights_on_cpu
