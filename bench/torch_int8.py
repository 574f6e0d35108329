"""Int8 weights in torch on this CPU: what an fx quantize mode could write, timed.

    python bench/torch_int8.py                      # K = 768, N = 3072, rows 1 and 128
    python bench/torch_int8.py --k 1024 --n 2816 --rows 1 16 128

`rewrite quantize`'s modes target onnxruntime's kernels. A torch.fx graph has no such kernels
unless something lowers its ops to them, so this measures the forms a weight-only int8 mode of
`rewrite.optimize_fx` could write for one `nn.Linear(K, N)` without bias (per output channel
scales s = max|w| / 127), 1 thread, float32 activations of `rows` rows:

* `float`: F.linear(x, w), the model as it is;
* `dequantize_per_channel`: F.linear(x, dequantize_per_channel(q, s, 0, axis 0)), the PT2E form
  (torch.ops.quantized_decomposed), which the fx frontend already reads and writes;
* `linear(x, q) * s`: F.linear(x, q.to(float32)) * s, the scale after the product;
* `_weight_int8pack_mm`: aten's weight-only int8 CPU kernel.

each eager and under torch.compile (inductor) with `torch._inductor.config.freezing` on and off
(freezing folds constants, and so may fold the dequantization back into a float weight).
Printed: the median microseconds of 200 calls and the ratio to `float` in the same setting,
the largest |difference| from float (the int8 rounding), and the bytes of weight each form
keeps (int8 and scales against float32).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch._inductor.config as inductor_config
import torch.ao.quantization.fx._decomposed
from rich.console import Console
from rich.table import Table

QD = torch.ops.quantized_decomposed


class Float(torch.nn.Module):
    def __init__(self, w: torch.Tensor):
        super().__init__()
        self.register_buffer("w", w)

    def forward(self, x):
        return torch.nn.functional.linear(x, self.w)


class Int8(torch.nn.Module):
    """A weight stored as int8 `q` [N, K] with one float32 scale per output channel `s` [N]."""

    def __init__(self, q: torch.Tensor, s: torch.Tensor):
        super().__init__()
        self.register_buffer("q", q)
        self.register_buffer("s", s)


class Dequantized(Int8):
    def forward(self, x):
        zp = torch.zeros(len(self.s), dtype=torch.int64)
        w = QD.dequantize_per_channel(self.q, self.s, zp, 0, -128, 127, torch.int8)
        return torch.nn.functional.linear(x, w)


class ScaledAfter(Int8):
    def forward(self, x):
        return torch.nn.functional.linear(x, self.q.to(x.dtype)) * self.s


class Packed(Int8):
    def forward(self, x):
        return torch.ops.aten._weight_int8pack_mm(x, self.q, self.s)


def median_us(f, x: torch.Tensor, calls: int = 200) -> float:
    """Median microseconds of `calls` calls of f(x), after 10 warm-up calls."""
    with torch.no_grad():
        for _ in range(10):
            f(x)
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            f(x)
            times.append(time.perf_counter() - start)
    return sorted(times)[calls // 2] * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=768, help="input features (default 768)")
    ap.add_argument("--n", type=int, default=3072, help="output features (default 3072)")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 128], help="activation rows")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    w = torch.randn(args.n, args.k) * 0.02
    s = w.abs().amax(1) / 127
    q = torch.clamp(torch.round(w / s[:, None]), -128, 127).to(torch.int8)
    forms = {
        "float": lambda: Float(w),
        "dequantize_per_channel": lambda: Dequantized(q, s),
        "linear(x, q) * s": lambda: ScaledAfter(q, s),
        "_weight_int8pack_mm": lambda: Packed(q, s),
    }
    weight_bytes = {"float": w.numel() * 4}
    for name in list(forms)[1:]:
        weight_bytes[name] = q.numel() + s.numel() * 4
    table = Table(title=f"Linear({args.k}, {args.n}), 1 thread: median us (ratio to float)")
    for col in ("rows", "form", "eager", "compiled, freezing", "compiled", "max |diff|", "bytes"):
        table.add_column(col, justify="left" if col == "form" else "right")
    for rows in args.rows:
        x = torch.randn(rows, args.k)
        base: dict[str, float] = {}
        for name, make in forms.items():
            cells = []
            for setting in ("eager", "freezing", "compiled"):
                torch._dynamo.reset()
                inductor_config.freezing = setting == "freezing"
                m = make().eval()
                f = m if setting == "eager" else torch.compile(m)
                us = median_us(f, x)
                base.setdefault(setting, us)
                cells.append(f"{us:.0f} ({us / base[setting]:.2f}x)")
            with torch.no_grad():
                diff = (make().eval()(x) - Float(w).eval()(x)).abs().max().item()
            table.add_row(str(rows), name, *cells, f"{diff:.1e}", str(weight_bytes[name]))
    Console(width=160).print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
