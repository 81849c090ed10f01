"""holdover protection for PyTorch Lightning and the Hugging Face Trainer (each only if installed).

    trainer = lightning.Trainer(callbacks=[HoldoverLightningCallback("ckpt/")])
    trainer = transformers.Trainer(..., callbacks=[HoldoverTrainerCallback("ckpt/")])

Both install the Guard when training starts (socket, SIGUSR2, registration), restore the newest
verified holdover checkpoint into the model and optimizer, call ``step_end`` after every optimizer
step, and stop training when a request asked to save and exit. They use SIGUSR2, never SIGUSR1
(Lightning's "save and requeue" under Slurm) or SIGTERM (the scheduler's). The framework's own
step counter is the checkpoint step; its own checkpoint files are left alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from holdover.train.guard import Guard, protect

try:
    import lightning.pytorch as _pl
except ImportError:  # pragma: no cover - depends on what is installed
    try:
        import pytorch_lightning as _pl  # type: ignore[no-redef]
    except ImportError:
        _pl = None  # type: ignore[assignment]

try:
    import transformers as _hf
except ImportError:  # pragma: no cover
    _hf = None  # type: ignore[assignment]


def _loss(outputs: Any) -> float | None:
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    try:
        return float(loss)
    except (TypeError, ValueError):
        return None


if _pl is not None:

    class HoldoverLightningCallback(_pl.Callback):
        def __init__(self, ckpt_dir: Path | str, name: str | None = None, **guard_kw: Any) -> None:
            self.ckpt_dir, self.name, self.kw = ckpt_dir, name, guard_kw
            self.guard: Guard | None = None
            self.resumed_step = 0

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            opt = trainer.optimizers[0] if trainer.optimizers else None
            sched = trainer.lr_scheduler_configs[0].scheduler if trainer.lr_scheduler_configs else None
            self.guard = protect(self.ckpt_dir, self.name, model=pl_module, optimizer=opt, scheduler=sched, **self.kw)
            self.resumed_step = self.guard.resume()

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            assert self.guard is not None
            if self.guard.step_end(self.resumed_step + trainer.global_step, loss=_loss(outputs)):
                trainer.should_stop = True

        def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
            if self.guard:
                self.guard.close()


if _hf is not None:

    class HoldoverTrainerCallback(_hf.TrainerCallback):
        def __init__(self, ckpt_dir: Path | str, name: str | None = None, **guard_kw: Any) -> None:
            self.ckpt_dir, self.name, self.kw = ckpt_dir, name, guard_kw
            self.guard: Guard | None = None
            self.last_loss: float | None = None
            self.resumed_step = 0

        def on_train_begin(
            self,
            args: Any,
            state: Any,
            control: Any,
            model: Any = None,
            optimizer: Any = None,
            lr_scheduler: Any = None,
            **kw: Any,
        ) -> None:
            self.guard = protect(
                self.ckpt_dir, self.name, model=model, optimizer=optimizer, scheduler=lr_scheduler, **self.kw
            )
            self.resumed_step = self.guard.resume()

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                self.last_loss = float(logs["loss"])

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> Any:
            assert self.guard is not None
            if self.guard.step_end(self.resumed_step + state.global_step, loss=self.last_loss):
                control.should_training_stop = True
            return control

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if self.guard:
                self.guard.close()
