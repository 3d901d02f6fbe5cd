"""`simulate --core-tuning`: the placement core's integer fields reach it as int (a float there
made the bindings raise std::bad_cast, so `--core-tuning tpot_slo_ns=100000000` could not run)."""

from __future__ import annotations

import json

from flexnpu.__main__ import main as flexnpu_main


def _run(tmp_path, *tuning: str) -> dict:
    out = tmp_path / "r.json"
    args = ["simulate", "--devices", "4", "--device", "cpu", "--model", "smollm2-135m",
            "--workload", "sharegpt", "--rate", "4", "--duration", "1", "--seeds", "1",
            "--policies", "dynamic", "--no-progress", "--json", str(out)]
    for t in tuning:
        args += ["--core-tuning", t]
    assert flexnpu_main(args) == 0
    return json.loads(out.read_text())


def test_integer_tuning_fields_run(tmp_path):
    doc = _run(tmp_path, "tpot_slo_ns=100000000", "max_executables=64", "tpot_weight=0.25")
    assert doc["config"]["core_tuning"] == {"tpot_slo_ns": 100000000, "max_executables": 64,
                                            "tpot_weight": 0.25}
    m = doc["policies"]["dynamic"]
    assert m["requests_finished"] + m["requests_dropped"] == m["requests_total"] > 0


def test_non_integer_nanoseconds_rejected_with_a_message(capsys):
    assert flexnpu_main(["simulate", "--core-tuning", "tpot_slo_ns=0.5"]) == 2
    assert "tpot_slo_ns takes an integer" in capsys.readouterr().err
    assert flexnpu_main(["simulate", "--core-tuning", "tpot_weight=abc"]) == 2
    assert "'abc' is not a number" in capsys.readouterr().err
