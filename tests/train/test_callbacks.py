"""The Lightning and Hugging Face Trainer callbacks, in real (tiny, CPU) training runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from holdover.train import ckpt


def test_lightning_callback_saves_periodically_and_resumes(tmp_path: Path) -> None:
    pl = pytest.importorskip("lightning.pytorch")
    from holdover.train.callbacks import HoldoverLightningCallback

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g))

    def fit(steps: int) -> tuple[Tiny, HoldoverLightningCallback]:
        model = Tiny()
        cb = HoldoverLightningCallback(tmp_path / "ck", "pl", interval=4, registry_dir=tmp_path / "reg", signal=None)
        trainer = pl.Trainer(
            max_steps=steps,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[cb],
        )
        trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=8))
        return model, cb

    first, _ = fit(8)
    steps = [ckpt.read_manifest(d).step for d in ckpt.candidates(tmp_path / "ck")]
    assert steps == [8, 4]
    from holdover.train import state

    saved = state.load(ckpt.candidates(tmp_path / "ck")[0])
    assert torch.equal(saved.tensors["net.weight"], first.net.weight.detach())  # the weights after step 8
    second, cb = fit(1)
    assert cb.resumed_step == 8
    assert not torch.equal(second.net.weight, Tiny().net.weight)  # it started from the checkpoint, not from scratch


def test_hf_trainer_callback_stops_after_a_save_and_exit_request(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from holdover.train.callbacks import HoldoverTrainerCallback

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def forward(self, x, labels):
            return {"loss": torch.nn.functional.mse_loss(self.net(x), labels)}

    g = torch.Generator().manual_seed(0)
    data = [{"x": torch.randn(8, generator=g), "labels": torch.randn(1, generator=g)} for _ in range(64)]

    class Asker(HoldoverTrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 3:
                self.guard.request("test", after="exit")
            return super().on_step_end(args, state, control, **kw)

    cb = Asker(tmp_path / "ck", "hf", registry_dir=tmp_path / "reg", signal=None)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=50,
        per_device_train_batch_size=8,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(model=Tiny(), args=args, train_dataset=data, callbacks=[cb])
    trainer.train()
    assert trainer.state.global_step == 3  # stopped right after the save
    [d] = ckpt.candidates(tmp_path / "ck")
    m = ckpt.verify(d)
    assert m.step == 3 and m.meta["reason"] == "test"
