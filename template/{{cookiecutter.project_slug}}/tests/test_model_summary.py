"""The model summary fit prints (engine/report/summary.py): FLOPs where torch's counter counted them, the attention
blocks counted as they train, and a line saying why not where it could not count them, never "Total FLOPs: 0"."""

import lightning as L
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.flop_counter import FlopCounterMode

from template_package.engine.report.summary import counted_summary, summary_table
from template_package.engine.training.trainer import Trainer


class Regression(L.LightningModule):
    """A linear layer, or (`fourier`) a learned scale of the input's Fourier magnitudes, which no formula of torch's
    FLOP counter covers; with `example` an example input of the width `example` (a wrong one fails the forward)."""

    def __init__(self, example: int | None = 32, fourier: bool = False) -> None:
        super().__init__()
        self.fourier = fourier
        self.layer = nn.Linear(32, 16)
        self.scale = nn.Parameter(torch.ones(32))
        if example is not None:
            self.example_input_array = torch.zeros(4, example)

    def forward(self, x: Tensor) -> Tensor:
        return torch.fft.rfft(x * self.scale).abs()[:, :16] if self.fourier else self.layer(x)

    def training_step(self, batch, batch_idx: int) -> Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Attention(L.LightningModule):
    """Two transformer encoder blocks, which torch runs through a fused kernel in eval mode."""

    def __init__(self) -> None:
        super().__init__()
        block = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(block, 2, enable_nested_tensor=False)
        self.example_input_array = torch.zeros(2, 10, 32)

    def forward(self, x: Tensor) -> Tensor:
        return self.blocks(x)


def fit_output(tmp_path, module: L.LightningModule, capfd) -> str:
    """What the engine's Trainer prints as a one-step fit of `module` starts."""
    data = DataLoader(TensorDataset(torch.randn(8, 32), torch.randn(8, 16)), batch_size=4)
    trainer = Trainer(max_steps=1, default_root_dir=tmp_path, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, limit_val_batches=0)  # fmt: skip
    trainer.fit(module, data)
    return capfd.readouterr().out


def test_a_counted_model_shows_its_flops(tmp_path, capfd):
    output = fit_output(tmp_path, Regression(), capfd)
    assert counted_summary(Regression())[0].total_flops == 2 * 4 * 32 * 16  # a forward of the example input
    assert "4.1 K     Total FLOPs (a forward of example_input_array)" in output.splitlines()
    assert "FLOPs not counted" not in output


def test_a_model_without_an_example_input_shows_no_flops_instead_of_0(tmp_path, capfd):
    output = fit_output(tmp_path, Regression(example=None), capfd)
    assert "Total FLOPs" not in output and "FLOPs |" not in output
    assert "FLOPs not counted: the module has no example_input_array (an input of its forward)" in output.splitlines()


def test_a_model_whose_operations_the_counter_misses_shows_no_flops_instead_of_0(tmp_path, capfd):
    output = fit_output(tmp_path, Regression(fourier=True), capfd)
    assert "Total FLOPs" not in output
    assert (
        "FLOPs not counted: torch's FLOP counter has a formula for none of the operations of its forward"
        in output.splitlines()
    )


def test_a_failing_example_input_leaves_the_run_and_the_modules_modes_as_they_were(tmp_path, capfd):
    module = Regression(example=5)  # the layer takes 32 features
    output = fit_output(tmp_path, module, capfd)
    assert "FLOPs not counted: the forward of example_input_array failed (RuntimeError: mat1 and mat2 shapes cannot " \
           "be multiplied (4x5 and 32x16))" in output.splitlines()  # fmt: skip
    assert module.trainer.global_step == 1  # (it trained its step)
    module.train()
    module.layer.eval()  # (a mix of modes, which the summary's forward in eval mode must not change)
    summary, not_counted = counted_summary(module)
    assert (module.training, module.layer.training) == (True, False)
    assert not_counted.startswith("the forward of example_input_array failed")
    assert "FLOPs" not in summary_table(summary, not_counted).splitlines()[0]  # (no FLOPs column)


def test_attention_blocks_are_counted_as_they_train():
    """In eval mode torch's fused kernel hides the blocks from the counter (Lightning's summary read 0 for them): the
    summary counts them as the training forward, which the counter sees whole."""
    module = Attention()
    with FlopCounterMode(display=False) as training, torch.no_grad():
        module(module.example_input_array)
    summary, not_counted = counted_summary(module)
    assert not_counted is None and training.get_total_flops() > 0
    assert summary.total_flops == training.get_total_flops()
    assert [sum(counts.values()) for counts in summary.flop_counts.values()] == [training.get_total_flops()]
