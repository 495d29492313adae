"""nanoGPT's model (karpathy/nanoGPT, model.py) moved onto the engine's TrainingRecipe as a new user would move it: the
network as it is, `training_step` returning the loss, and no method of the recipe overridden (no
`configure_optimizers`): nanoGPT's optimizer, schedule and clipping are options, set in helpers/nano_gpt.yaml. The
data: nanoGPT's `get_batch` (windows at random offsets of a token stream) on synthetic text of 65 characters, as
Shakespeare-char has. Read by tests/test_nanogpt_port.py.
"""

import math

import lightning as L
import torch
import torch.nn.functional as F
from lightning import LightningDataModule
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from template_package.engine.training.recipe import TrainingRecipe


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)
        self.n_head, self.dropout = n_head, dropout

    def forward(self, x: Tensor) -> Tensor:
        batch, length, width = x.shape
        q, k, v = (t.view(batch, length, self.n_head, -1).transpose(1, 2) for t in self.c_attn(x).split(width, dim=2))
        dropout = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(batch, length, width)))


class MLP(nn.Module):
    def __init__(self, n_embd: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd, bias=bias), nn.LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, bias)
        self.mlp = MLP(n_embd, dropout, bias)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(TrainingRecipe):
    """nanoGPT's GPT: token and position embeddings, pre-norm blocks, a head tied to the token embedding.

    Args:
        vocab_size: tokens; None: the data's.
        block_size: the longest context; None: the data's.
        n_layer: transformer blocks.
        n_head: attention heads per block.
        n_embd: the embedding width.
        dropout: dropout in the blocks and after the embeddings.
        bias: biases in the linear layers and LayerNorms, as GPT-2 has.
    """

    def __init__(
        self,
        vocab_size: int | None = None,
        block_size: int | None = None,
        n_layer: int = 4,
        n_head: int = 4,
        n_embd: int = 128,
        dropout: float = 0.0,
        bias: bool = False,
        **recipe,
    ) -> None:
        super().__init__(**recipe)
        self.save_hyperparameters()
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(vocab_size, n_embd),
                "wpe": nn.Embedding(block_size, n_embd),
                "drop": nn.Dropout(dropout),
                "h": nn.ModuleList(Block(n_embd, n_head, dropout, bias) for _ in range(n_layer)),
                "ln_f": nn.LayerNorm(n_embd, bias=bias),
            }
        )
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying: one parameter, named once
        self.apply(self._init_weights)
        for name, param in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2's scaled init of the residual projections
                torch.nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            torch.nn.init.zeros_(module.bias)

    def forward(self, idx: Tensor) -> Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(positions))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self(x).flatten(0, 1), y.flatten())

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", F.cross_entropy(self(x).flatten(0, 1), y.flatten()))


class RandomWindows(Dataset):
    """nanoGPT's get_batch as a dataset: each sample a window of `block_size` tokens at a random offset of `tokens`
    (drawn from torch's generator, which the engine seeds for each sample) and the same window one token on."""

    def __init__(self, tokens: Tensor, block_size: int, length: int) -> None:
        self.tokens, self.block_size, self.length = tokens, block_size, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        start = int(torch.randint(len(self.tokens) - self.block_size, ()))
        window = self.tokens[start : start + self.block_size + 1]
        return window[:-1], window[1:]


class CharData(LightningDataModule):
    """Synthetic text of `vocab_size` characters (90% to train on, 10% to validate), in nanoGPT's random windows.

    Args:
        block_size: tokens a window.
        batch_size: windows a batch.
        vocab_size: distinct characters.
    """

    def __init__(self, block_size: int = 64, batch_size: int = 12, vocab_size: int = 65) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.block_size, self.vocab_size = block_size, vocab_size
        self.tokens = torch.randint(vocab_size, (100_000,), generator=torch.Generator().manual_seed(0))

    def train_dataloader(self) -> DataLoader:
        train = RandomWindows(self.tokens[:90_000], self.block_size, length=self.hparams.batch_size * 1000)
        return DataLoader(train, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        val = RandomWindows(self.tokens[90_000:], self.block_size, length=self.hparams.batch_size * 20)
        return DataLoader(val, batch_size=self.hparams.batch_size)


class RecordLRs(L.Callback):
    """Every param group's LR at each optimizer step, as the step is taken: `lrs[step][group]`."""

    def __init__(self) -> None:
        self.lrs: list[list[float]] = []

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        self.lrs.append([group["lr"] for group in optimizer.param_groups])
