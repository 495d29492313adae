"""The model summary that fit prints as it starts: Lightning's table of layers, parameters and sizes, with FLOPs only
where they were counted.

Lightning counts FLOPs with torch's FlopCounterMode on one forward of the module's `example_input_array` and prints the
count whatever it is: "Total FLOPs: 0" for a module without an example input, or whose forward runs only operations the
counter has no formula for, reads as a measurement. Here that line says that the FLOPs were not counted, and why.
Multi-head attention is counted on the path training takes: in eval mode (the summary's forward) torch runs
`nn.TransformerEncoderLayer` and `nn.MultiheadAttention` through a fused inference kernel the counter does not know, and
their blocks would read 0. Depends on torch and lightning.
"""

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelSummary as LightningModelSummary
from lightning.pytorch.utilities.model_summary import ModelSummary as Summary
from lightning.pytorch.utilities.model_summary import get_human_readable_count, summarize


class ModelSummary(LightningModelSummary):
    """Lightning's ModelSummary callback, whose FLOPs line and column show only a count that was made (see above).

    Args:
        max_depth: the depth of nested layers the table shows (-1: all); 0: no summary.
    """

    def __init__(self, max_depth: int = 1) -> None:
        super().__init__(max_depth=max_depth)
        self.max_depth = max_depth

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.max_depth:
            return
        # On every rank: the forward of a sharded module is collective.
        summary, not_counted = counted_summary(pl_module, self.max_depth)
        if trainer.is_global_zero:
            print(summary_table(summary, not_counted))


def counted_summary(module: L.LightningModule, max_depth: int = 1) -> tuple[Summary, str | None]:
    """Lightning's summary of `module`, and why its FLOPs were not counted (None: they were). A forward of the example
    input that fails leaves the module's train and eval modes as they were, and the summary without sizes."""
    if module.example_input_array is None:
        return summarize(module, max_depth), "the module has no example_input_array (an input of its forward)"
    modes = {name: part.training for name, part in module.named_modules()}
    fast_path = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)  # (attention counted as it trains: see the module's docstring)
    try:
        summary = summarize(module, max_depth)
    except Exception as error:  # noqa: BLE001 - a summary never stops a run; the line says what happened
        for name, part in module.named_modules():
            part.train(modes[name])
        reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
        example, module.example_input_array = module.example_input_array, None
        try:
            summary = summarize(module, max_depth)
        finally:
            module.example_input_array = example
        return summary, f"the forward of example_input_array failed ({type(error).__name__}: {reason:.200})"
    finally:
        torch.backends.mha.set_fastpath_enabled(fast_path)
    if summary.total_flops == 0:
        return summary, "torch's FLOP counter has a formula for none of the operations of its forward"
    return summary, None


def summary_table(summary: Summary, not_counted: str | None) -> str:
    """Lightning's plain summary table; the FLOPs column and total only when they were counted, else a line why not."""
    columns = [
        (" ", [str(index) for index in range(len(summary.layer_names))]),
        ("Name", summary.layer_names),
        ("Type", summary.layer_types),
        ("Params", [get_human_readable_count(count) for count in summary.param_nums]),
        ("Mode", ["train" if training else "eval" for training in summary.training_modes]),
    ]
    if not_counted is None:
        columns.append(("FLOPs", [get_human_readable_count(sum(c.values())) for c in summary.flop_counts.values()]))
    if any(size != "?" for size in summary.in_sizes):  # (a forward of the example input ran)
        columns += [("In sizes", list(map(str, summary.in_sizes))), ("Out sizes", list(map(str, summary.out_sizes)))]
    other = summary.total_parameters - summary.total_layer_params
    if other > 0:  # (parameters of the module itself, outside its layers)
        row = {" ": "", "Name": "other params", "Params": get_human_readable_count(other)}
        columns = [(name, [*values, row.get(name, "n/a")]) for name, values in columns]
    widths = [max(len(name), *(len(value) for value in values)) for name, values in columns]
    rows = [[name for name, _ in columns], *zip(*(values for _, values in columns), strict=True)]
    lines = [" | ".join(f"{cell:<{width}}" for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    rule = "-" * max(len(line) for line in lines)
    trainable, total = summary.trainable_parameters, summary.total_parameters
    modes = summary.total_training_modes
    totals = [
        (get_human_readable_count(trainable), "Trainable params"),
        (get_human_readable_count(total - trainable), "Non-trainable params"),
        (get_human_readable_count(total), "Total params"),
        (f"{summary.model_size:,.3f}", "Total estimated model params size (MB)"),
        (str(modes["train"]), "Modules in train mode"),
        (str(modes["eval"]), "Modules in eval mode"),
    ]
    if not_counted is None:
        totals.append((get_human_readable_count(summary.total_flops), "Total FLOPs (a forward of example_input_array)"))
    footer = [f"{value:<10}{what}" for value, what in totals]
    if not_counted is not None:
        footer.append(f"FLOPs not counted: {not_counted}")
    return "\n".join([lines[0], rule, *lines[1:], rule, *footer])
