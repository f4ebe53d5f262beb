"""``bench/bench_pipeline.py`` (``make bench-pipeline``) keeps working: a tiny run writes its section into a
copy of a Markdown file, in place of the old one, and the pipeline beats the batches there too. No cluster."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_pipeline.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_pipeline", BENCH)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_a_section_is_replaced_up_to_the_next_heading_or_appended() -> None:
    bench = load()
    text = "# B\n\n## A\nold a\n\n## Pipeline\nold\n\n## C\nc\n"
    assert bench.replace_section(text, "## Pipeline", "## Pipeline\nnew\n") == "# B\n\n## A\nold a\n\n## Pipeline\nnew\n\n## C\nc\n"
    assert bench.replace_section("# B\n\n## A\na\n", "## Pipeline", "## Pipeline\nnew") == "# B\n\n## A\na\n\n## Pipeline\nnew\n\n"


def test_a_tiny_run_writes_its_section(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    bench = load()
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# Benchmarks\n\n## Pipeline\nstale\n\n## After\nkept\n")
    monkeypatch.setattr(sys, "argv", ["bench_pipeline.py", "--items", "16", "--scale", "0.002", "--rounds", "1",
                                      "--batch", "4", "--settle", "0", "--write-doc", str(doc)])
    assert bench.main() == 0
    text = doc.read_text()
    assert "stale" not in text and text.endswith("## After\nkept\n")
    rows = {tuple(cell.strip() for cell in line.split("|")[1:3]): line for line in text.splitlines() if line.startswith("| fixed")}
    assert set(rows) == {("fixed", "pipeline"), ("fixed", "batch 4")}
    assert "| 1.00x |" in rows[("fixed", "pipeline")]
    ratio = float(rows[("fixed", "batch 4")].split("|")[6].strip().rstrip("x"))
    assert ratio > 1.1, "batches of 4 on 8 GPU slots leave half of them idle: the pipeline is faster"
    assert "wrote the '## Pipeline' section" in capsys.readouterr().out
