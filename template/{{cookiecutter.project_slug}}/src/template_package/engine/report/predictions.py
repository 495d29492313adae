"""`predict` writes `predictions.csv`: one row per input, whatever the model returns (class probabilities with class
names, text, or values). Depends on torch and lightning."""

import csv
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter


class PredictionsCSV(BasePredictionWriter):
    """Writes what `predict_step` returns to a CSV file, one row per input.

    Columns: `index` in the predict dataset, `file` when the dataset has files (an ImageFolder, a folder of new
    images), then by what predict_step returns for a batch: class probabilities (a 2-D tensor whose rows are
    non-negative and sum to 1) give `prediction`, the most likely class (named by the DataModule's `classes`, when it
    has them), and `p_<class>` for every class; any other 2-D tensor (a regression's outputs) gives `y_0`, `y_1`, ...;
    a list of strings or a 1-D tensor gives `prediction`, the text or the value.

    Args:
        path: the CSV file; the CLI sets it to `<default_root_dir>/predictions.csv`.
    """

    def __init__(self, path: str) -> None:
        super().__init__(write_interval="epoch")
        self.path = Path(path)

    def write_on_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, predictions, batch_indices) -> None:
        dataset = trainer.predict_dataloaders.dataset
        files = getattr(dataset, "files", None) or [path for path, _ in getattr(dataset, "samples", [])] or None
        tensors = [batch for batch in predictions if isinstance(batch, torch.Tensor)]
        matrix = bool(tensors) and len(tensors) == len(predictions) and all(t.ndim == 2 for t in tensors)
        probabilities = matrix and all(is_a_distribution(t) for t in tensors)
        width = tensors[0].shape[1] if matrix else 0
        classes = getattr(trainer.datamodule, "classes", None) or [str(i) for i in range(width)]
        if probabilities:
            columns = ["prediction", *(f"p_{c}" for c in classes)]
        else:
            columns = [f"y_{i}" for i in range(width)] if matrix else ["prediction"]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["index", *(["file"] * bool(files)), *columns])
            for batch, indices in zip(predictions, batch_indices[0], strict=True):
                rows = batch.float().tolist() if isinstance(batch, torch.Tensor) else list(batch)
                for index, row in zip(indices, rows, strict=True):
                    file = [files[index]] if files else []
                    if probabilities:
                        best = classes[max(range(len(row)), key=row.__getitem__)]
                        writer.writerow([index, *file, best, *(f"{p:.6f}" for p in row)])
                    else:
                        writer.writerow([index, *file, *(row if matrix else [row])])
        print(f"predictions written to {self.path}")


def is_a_distribution(batch: torch.Tensor) -> bool:
    """Whether every row holds probabilities: a floating-point tensor, non-negative, each row summing to 1."""
    rows = batch.float()
    return batch.is_floating_point() and bool((rows >= 0).all()) and bool(((rows.sum(-1) - 1).abs() < 1e-3).all())
