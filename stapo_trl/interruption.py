"""Stopping a training run without losing it, and resuming it without alarm.

SIGINT (Ctrl-C) or SIGTERM (SLURM preemption, `kill`) finishes the optimizer step under way, saves a checkpoint and
stops; the training script then says which checkpoint survived and the command that continues from it. Resuming
a model whose output layer is tied to its input embeddings logs a missing `lm_head.weight` that is not missing:
`tied_weights_explained` says so.
"""

import contextlib
import logging
import re
import shlex
import signal
import sys
from pathlib import Path

import torch
from transformers import TrainerCallback

from .output_dir import last_complete_checkpoint


def _shown(path) -> str:
    """A path relative to the working directory when inside it, as the user would type it."""
    path = Path(path).resolve()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


class StopOnSignal(TrainerCallback):
    """On SIGINT or SIGTERM: finish the optimizer step under way, save a checkpoint and stop training, so that at
    most that step's progress since the last save is redone; a second Ctrl-C stops at once, without saving.

    Each process receives the signal, not necessarily within the same step: they agree at each step end (a max over
    processes) so that all of them save and stop at the same step.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, accelerator):
        self.accelerator = accelerator
        self.received: int | None = None

    @contextlib.contextmanager
    def installed(self):
        """The handlers, for the duration of `trainer.train`; the previous ones are restored after."""
        previous = {number: signal.signal(number, self._handle) for number in self.SIGNALS}
        try:
            yield self
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)

    def _handle(self, number, frame) -> None:
        if self.received is not None:
            if number == signal.SIGINT:  # a second Ctrl-C: the user does not want to wait for the save
                raise KeyboardInterrupt
            return  # a launcher passing the signal on: the save is under way already
        self.received = number
        if self.accelerator.is_main_process:
            print(
                f"\n{signal.Signals(number).name}: finishing this optimizer step, then saving a checkpoint "
                "(Ctrl-C again to stop at once, without saving).",
                file=sys.stderr,
                flush=True,
            )

    def on_step_end(self, args, state, control, **kwargs):
        stop = torch.tensor(int(self.received is not None), device=self.accelerator.device)
        if self.accelerator.num_processes > 1:
            stop = self.accelerator.reduce(stop, reduction="max")
        if stop.item():
            self.received = self.received or signal.SIGTERM  # another process was signalled first
            control.should_save = True
            control.should_training_stop = True
        return control

    def report(self, state, output_dir) -> str:
        """One line: the step reached, the checkpoint that survived, the command that continues from it."""
        latest = last_complete_checkpoint(output_dir)
        argv = []
        for token in sys.argv[1:]:  # the same command, without an earlier --resume_from_checkpoint VALUE
            if argv and argv[-1] == "--resume_from_checkpoint":
                argv.pop()
            elif not token.startswith("--resume_from_checkpoint="):
                argv.append(token)
        if argv and argv[-1] == "--resume_from_checkpoint":
            argv.pop()
        command = shlex.join(["python", _shown(sys.argv[0]), *argv, "--resume_from_checkpoint", "latest"])
        if self.accelerator.num_processes > 1:
            command += " (under the same launcher)"
        saved = f"{_shown(latest)} is saved" if latest else "no checkpoint could be saved"
        return (
            f"Stopped at step {state.global_step} of {state.max_steps} ({signal.Signals(self.received).name}): "
            f"{saved}. To continue: {command}"
        )


@contextlib.contextmanager
def tied_weights_explained(model):
    """Resuming logs "There were missing keys in the checkpoint model loaded: ['lm_head.weight']" for a model whose
    output layer is tied to its input embeddings: checkpoints do not store the tied copy, and nothing is lost. Say
    that instead; any other missing key is reported as transformers reports it."""
    tied = set(getattr(model, "_tied_weights_keys", None) or ())
    if not getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        tied = set()

    def explain(record) -> bool:
        message = record.getMessage()
        if tied and message.startswith("There were missing keys in the checkpoint model loaded:"):
            missing = set(re.findall(r"'([^']+)'", message))
            if missing and missing <= tied:
                record.msg = (
                    f"Resumed: {', '.join(sorted(missing))} is tied to the input embeddings, so checkpoints do not "
                    "store it; it was restored from them (nothing is missing)."
                )
                record.args = ()
        return True

    logger = logging.getLogger("transformers.trainer")
    logger.addFilter(explain)
    try:
        yield
    finally:
        logger.removeFilter(explain)
