"""tools/check_layers.py: the include and import graph runs one way (docs/architecture.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "check_layers.py"


def run(repo: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOL), str(repo)], capture_output=True, text=True, check=False
    )


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_this_tree_has_no_arrow_running_up() -> None:
    result = run(REPO)
    assert result.returncode == 0, result.stdout
    assert result.stdout.strip().endswith("check_layers: 0 arrow(s) running up")


def test_upward_includes_and_imports_are_named(tmp_path: Path) -> None:
    write(tmp_path, "pjrt_flexnpu/base/status.h", "")
    write(tmp_path, "pjrt_flexnpu/placement/core.cc", '#include "pjrt_flexnpu/runtime/client.h"\n')
    write(tmp_path, "pjrt_flexnpu/runtime/client.cc", '#include "pjrt_flexnpu/base/status.h"\n')
    write(tmp_path, "pjrt_flexnpu/backend/open.cc", '#include "pjrt_flexnpu/daemon/server.h"\n')
    write(tmp_path, "python/flexnpu/__init__.py", "")
    write(tmp_path, "python/flexnpu/serving/engine.py", "from flexnpu.sim import cluster\n")
    write(tmp_path, "python/flexnpu/sim/cluster.py", "from flexnpu.serving.engine import _Thing\n")
    write(tmp_path, "python/flexnpu/analysis.py", "import flexnpu.serving.engine\n")
    result = run(tmp_path)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[-1] == "check_layers: 5 arrow(s) running up"
    assert (
        "pjrt_flexnpu/placement/core.cc: placement includes pjrt_flexnpu/runtime/client.h"
        " (runtime is above it)" in lines
    )
    assert (
        "pjrt_flexnpu/backend/open.cc: backend includes pjrt_flexnpu/daemon/server.h"
        " (daemon is above it)" in lines
    )
    assert (
        "python/flexnpu/serving/engine.py: serving imports flexnpu.sim (sim is above it)" in lines
    )
    assert (
        "python/flexnpu/sim/cluster.py: imports private _Thing of flexnpu.serving.engine" in lines
    )
    assert (
        "python/flexnpu/analysis.py: core imports flexnpu.serving.engine (serving is above it)"
        in lines
    )
