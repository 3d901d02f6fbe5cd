"""The fake vendor libraries of tests/fakes/, compiled with the system C compiler for pytest
(CMake builds the same sources for the C++ tests)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FAKES = REPO / "tests" / "fakes"

# variant folder -> (file name, source, defines)
VARIANTS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "ascendcl": ("libascendcl.so", "fake_ascendcl.c", ()),
    "ascendcl_no_util": ("libascendcl.so", "fake_ascendcl.c", ("FAKE_OMIT_UTILIZATION",)),
    "ascendcl_no_meminfo": ("libascendcl.so", "fake_ascendcl.c", ("FAKE_OMIT_MEMINFO",)),
    "dcmi": ("libdcmi.so", "fake_dcmi.c", ()),
    "nvml": ("libnvidia-ml.so.1", "fake_nvml.c", ()),
    "cuda": ("libcuda.so.1", "fake_cuda.c", ()),
}


def build_fakes(out: Path) -> dict[str, Path]:
    """Compiles every variant into out/<variant>/<file name>; returns variant -> path."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc/gcc) to build the fake vendor libraries")
    paths = {}
    for variant, (file_name, source, defines) in VARIANTS.items():
        target = out / variant / file_name
        target.parent.mkdir(parents=True, exist_ok=True)
        cmd = [
            compiler, "-shared", "-fPIC", "-O1", "-fvisibility=hidden",
            f"-I{REPO}", f"-I{FAKES}",
            *(f"-D{d}" for d in defines),
            "-o", str(target), str(FAKES / source), str(FAKES / "fake_script.c"),
        ]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        paths[variant] = target
    return paths
