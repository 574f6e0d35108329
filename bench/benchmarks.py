"""Regenerate docs/benchmarks.md: every benchmark section, each stamped with its command and commit.

    python bench/benchmarks.py                         # every section (hours: run with nohup)
    python bench/benchmarks.py --sections zoo fuzz     # some sections; the others are kept
    python bench/benchmarks.py --list                  # the sections and their commands

Each section is the Markdown one benchmark script prints. The document keeps one block per
section between `<!-- section: NAME -->` and `<!-- end: NAME -->`; a run replaces the blocks of
the sections it ran and keeps the others as they were, with their own stamps, so every table
always says which commit and command produced it. A section whose command fails is not
replaced (its old block stays), and the run exits 1 naming it.
"""

from __future__ import annotations

import argparse
import datetime
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"


@dataclass(frozen=True)
class Section:
    """One section of docs/benchmarks.md: its title, the commands that produce it (the last one
    prints the section's Markdown on stdout) and what it measures."""

    name: str
    title: str
    commands: tuple[tuple[str, ...], ...]
    about: str


PY = sys.executable
SECTIONS = (
    Section(
        "peers",
        "Full-size models: rewrite against onnxsim (in memory, CLI, peak memory)",
        ((PY, "bench/models.py"), (PY, "bench/peers.py", "--no-latency", "--markdown", "{md}")),
        "Seconds of the in-memory call (a loaded ModelProto, output check off) and of the CLI "
        "end to end (process start to exit, default output check), and peak RSS.",
    ),
    Section(
        "zoo",
        "ONNX model zoo CNNs (opsets 6-9) against onnxsim and onnxslim",
        ((PY, "bench/zoo.py"),),
        "Compute nodes after each tool on the classic CNNs the onnx package ships.",
    ),
    Section(
        "fx",
        "torch.fx and torch.compile",
        ((PY, "bench/fx_bench.py"), (PY, "bench/fx_bench.py", "--markdown")),
        "fx nodes before and after, the rewrite's seconds, first-call and steady-state ratios.",
    ),
    Section(
        "scaling",
        "Scaling with graph size",
        ((PY, "bench/run.py", "--markdown"),),
        "Seconds per stage on synthetic Llama-like graphs of 1k, 10k and 50k nodes.",
    ),
    Section(
        "conformance",
        "ONNX backend node conformance suite",
        ((PY, "bench/conformance.py", "--markdown"),),
        "Every node case through the optimizer, compared with its expected outputs.",
    ),
    Section(
        "fuzz",
        "Graph fuzzing",
        ((PY, "bench/fuzz.py", "--markdown"),),
        "10,000 random valid models optimized and compared with their originals.",
    ),
    Section(
        "quant",
        "Dynamic int8 quantization against onnxruntime's quantizer",
        ((PY, "bench/quant.py", "--models", "bert"),),
        "Latency against the float model, output error and argmax agreement, quantizer seconds "
        "and file size: rewrite quantize (per tensor, per channel) beside quantize_dynamic.",
    ),
)


def commit() -> str:
    """The checked-out commit (short hash), with `+dirty` when the work tree has changes."""
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return head + ("+dirty" if dirty else "")


def render(section: Section, body: str, stamp: str) -> str:
    """The block of one section: title, stamp (commit, date, commands), what it measures, the
    Markdown the benchmark printed."""
    commands = " && ".join(" ".join(["python", *c[1:]]) for c in section.commands)
    return (
        f"<!-- section: {section.name} -->\n## {section.title}\n\n"
        f"Generated at {stamp} by `{commands}`. {section.about}\n\n{body.strip()}\n"
        f"<!-- end: {section.name} -->"
    )


def blocks(text: str) -> dict[str, str]:
    """section name -> its whole block (markers included) in the document text."""
    pattern = r"<!-- section: (\w+) -->.*?<!-- end: \1 -->"
    return {m.group(1): m.group(0) for m in re.finditer(pattern, text, re.S)}


def run(section: Section) -> str:
    """Run a section's commands; the Markdown the last one wrote to `{md}` (a temporary file
    named in its arguments), else its stdout. Raises CalledProcessError."""
    out = ""
    with tempfile.TemporaryDirectory() as tmp:
        md = Path(tmp) / "section.md"
        for cmd in section.commands:
            cmd = [str(md) if a == "{md}" else a for a in cmd]
            done = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
            out = md.read_text() if md.exists() else done.stdout
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the chosen sections and rewrite docs/benchmarks.md in place (atomically)."""
    names = [s.name for s in SECTIONS]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sections", nargs="+", default=names, choices=names, metavar="NAME")
    ap.add_argument("--list", action="store_true", help="print the sections and commands")
    args = ap.parse_args(argv)
    if args.list:
        for s in SECTIONS:
            print(f"{s.name:12} {' && '.join(' '.join(c[1:]) for c in s.commands)}")
        return 0
    text = DOC.read_text()
    old = blocks(text)
    stamp = f"commit {commit()}, {datetime.date.today().isoformat()}"
    failed = []
    for s in SECTIONS:
        if s.name not in args.sections:
            continue
        print(f"{s.name}: running", file=sys.stderr, flush=True)
        try:
            new = render(s, run(s), stamp)
        except subprocess.CalledProcessError as e:
            failed.append(s.name)
            print(f"error: section {s.name} failed: {e.stderr[-500:]}", file=sys.stderr)
            continue
        if s.name in old:
            text = text.replace(old[s.name], new)
        else:
            text = text.rstrip("\n") + "\n\n" + new + "\n"
    tmp = DOC.with_suffix(".md.tmp")
    tmp.write_text(text)
    tmp.replace(DOC)
    if failed:
        print(f"error: sections failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
