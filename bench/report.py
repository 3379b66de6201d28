"""Turn the JSON that ``invoke bench`` collects into Markdown tables for docs/benchmarks.md.

usage: python bench/report.py DIR   (DIR holds NAME.json from each bench/NAME.py --json)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import common

ORDER = ("launch_fanout", "e2e_overhead", "allocation", "scale", "agent_footprint",
         "failure_detection")


def render(directory: Path) -> str:
    found = {p.stem: json.loads(p.read_text()) for p in directory.glob("*.json")}
    names = [n for n in ORDER if n in found] + sorted(set(found) - set(ORDER))
    if not names:
        return f"no results in {directory}\n"
    first = found[names[0]]
    m = first["machine"]
    lines = [
        f"Run started {first['started']}; {m['nproc']} CPUs ({m['cpu']}), "
        f"{m['memory_gib']} GiB memory, Python {m['python']}.",
        "",
    ]
    for name in names:
        result = found[name]
        load = " ".join(f"{x:.2f}" for x in result["machine"]["loadavg"])
        end = " ".join(f"{x:.2f}" for x in result["load_at_end"])
        during = result.get("load_during", {})
        lines += [
            f"### {name}",
            "",
            f"`{result['command']}` — started {result['started']}, took "
            f"{result['elapsed_s']:.0f} s; load average (1/5/15 min) {load} at start, "
            f"{end} at the end; 1-min load during the run: mean {during.get('mean', 'n/a')}, "
            f"max {during.get('max', 'n/a')}.",
            "",
            "| figure | value |",
            "| --- | --- |",
        ]
        for row in result["rows"]:
            value = common.fmt(row["value"])
            unit = f" {row['unit']}" if row["unit"] else ""
            figure = row["figure"].strip()
            if row["figure"].startswith("  "):
                figure = f"&nbsp;&nbsp;{figure}"
            lines.append(f"| {figure} | {value}{unit} |")
        lines.append("")
        lines += [f"- {note}" for note in result["notes"]]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(render(Path(sys.argv[1])))
