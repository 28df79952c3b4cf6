"""docs/demo.md's transcript is what `fedunlearn demo` prints (scripts/demo_transcript.py makes it
from a real run): its step announcements and its retirement line are the ones the code prints now.
A run of the demo takes a minute; this compares the section with the same functions instead."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cli.train import DemoSteps, retired_line

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from demo_transcript import BEGIN, END, render, replace_section, section_of, transcript_lines  # noqa: E402

SCENARIO = "mnist5k-hfl"


@pytest.fixture(scope="module")
def printed() -> list[str]:
    return transcript_lines((ROOT / "docs" / "demo.md").read_text())


def test_the_transcript_announces_each_step_as_the_code_does(printed):
    steps = DemoSteps.of(ROOT, SCENARIO)
    announced = [line for line in printed if line.startswith("== ")]
    assert [line.split(".")[0] for line in announced] == [f"== {n}" for n in range(1, 7)]
    assert announced[0] == f"== 1. {steps.training}"
    assert announced[2] == f"== 3. {steps.batch}"
    assert announced[4] == f"== 5. {steps.exact_retrain}"


def test_the_transcript_says_what_the_demo_retires_and_why(printed):
    retired = [line.strip() for line in printed if line.strip().startswith("retired v")]
    assert retired == [retired_line(SCENARIO, ["1", "2"])]
    table = printed[printed.index(next(line for line in printed if line.startswith("version "))):]
    assert sum("retired by batch-" in line for line in table) == 2  # the comparison keeps their records


def test_the_section_counts_its_lines_and_replaces_only_itself():
    doc = (ROOT / "docs" / "demo.md").read_text()
    lines = transcript_lines(doc)
    assert f"it printed these {len(lines)} lines" in section_of(doc)
    section = render("== 1. a\n   b\n", "abc1234", 61.4)
    replaced = replace_section(f"before\n{BEGIN}\nold\n{END}\nafter\n", section)
    assert replaced == f"before\n{section}\nafter\n" and transcript_lines(replaced) == ["== 1. a", "   b"]
    assert "code of abc1234, 61 s" in replaced
