"""A cluster's topology: its hosts (each with its device count), the link between devices of one
host and the network between hosts. One description for the layers that meet it: the Ray front
reports the topology of its live replicas in it (`GET /cluster/topology`), and the simulator
(`python -m flexnpu simulate --hosts 48x8 --inter-host-link roce`, or `--topology FILE.json`)
runs over it.

Devices are numbered host by host; a unit of `parallel` devices (one serving instance) covers
devices [u * parallel, (u + 1) * parallel). A unit lies inside one host, or spans whole hosts
(parallel a multiple of their device counts); a unit that would cover part of a host and part
of another is refused (`unit_hosts`).

A link is a name of the link table (xla_passes/roofline.cc, `flexnpu.analysis.link_table()`:
hccs, nvlink, roce, pcie, memcpy), or measured bandwidth and latency, or unknown (None: the
front before any KV crossed hosts). Bandwidth is one direction, per device, as in the link
table: a unit of `parallel` devices moves KV at parallel x that. The names are resolved by the
user (the simulator), which keeps this module free of the native library.

JSON:
    {"hosts": [{"name": "host0", "devices": 8}, ...],
     "intra_host_link": "hccs",
     "inter_host_link": "roce" | {"bytes_per_s": 5e10, "latency_s": 1e-5, "source": "..."} | null}

Presets worth naming: a CloudMatrix384-like supernode (48 hosts of 8 NPUs, the UB plane between
hosts as fast as within: `48x8` with hccs both ways, the same as one host of 384) and a
conventional cluster (8 devices per host on hccs / nvlink, RoCE between: `48x8` with
`inter_host_link` roce).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_SPEC_ITEM = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")


@dataclass(frozen=True)
class Link:
    """A link: a link-table `name`, or measured `bytes_per_s` (one direction, per device) and
    `latency_s` (then `name` is free text, "" or "measured")."""

    name: str = ""
    bytes_per_s: float | None = None
    latency_s: float | None = None
    source: str = ""

    @property
    def measured(self) -> bool:
        return self.bytes_per_s is not None

    def to_json(self) -> str | dict[str, Any]:
        if not self.measured:
            return self.name
        out: dict[str, Any] = {"bytes_per_s": self.bytes_per_s, "latency_s": self.latency_s or 0.0}
        if self.name:
            out["name"] = self.name
        if self.source:
            out["source"] = self.source
        return out

    @classmethod
    def from_json(cls, value: Any, where: str) -> Link | None:
        if value is None:
            return None
        if isinstance(value, str):
            if not value.strip():
                raise ValueError(f"topology: {where} must be a link name or an object, got ''")
            return cls(value.strip())
        if not isinstance(value, dict):
            raise ValueError(
                f"topology: {where} must be a link name, an object with bytes_per_s and "
                f"latency_s, or null; got {value!r}"
            )
        unknown = set(value) - {"name", "bytes_per_s", "latency_s", "source"}
        if unknown:
            raise ValueError(f"topology: {where} has unknown field(s) {sorted(unknown)}")
        bw = value.get("bytes_per_s")
        if isinstance(bw, bool) or not isinstance(bw, int | float) or not (bw > 0):
            raise ValueError(f"topology: {where}.bytes_per_s must be a number > 0, got {bw!r}")
        if not math.isfinite(bw):
            raise ValueError(f"topology: {where}.bytes_per_s must be finite, got {bw!r}")
        lat = value.get("latency_s", 0.0)
        if (
            isinstance(lat, bool)
            or not isinstance(lat, int | float)
            or not (lat >= 0 and math.isfinite(lat))
        ):
            raise ValueError(f"topology: {where}.latency_s must be a number >= 0, got {lat!r}")
        for key in ("name", "source"):
            if not isinstance(value.get(key, ""), str):
                raise ValueError(f"topology: {where}.{key} must be a string")
        return cls(value.get("name", ""), float(bw), float(lat), value.get("source", ""))


@dataclass(frozen=True)
class Host:
    name: str
    devices: int


@dataclass(frozen=True)
class Topology:
    """Hosts in device order, the link within a host and the one between hosts (None:
    unknown). See the module's docstring."""

    hosts: tuple[Host, ...]
    intra_host_link: Link | None = None
    inter_host_link: Link | None = None

    def __post_init__(self) -> None:
        if not self.hosts:
            raise ValueError("topology: hosts must list at least one host")
        for i, h in enumerate(self.hosts):
            if not isinstance(h.name, str) or not h.name:
                raise ValueError(f"topology: hosts[{i}].name must be a non-empty string")
            if isinstance(h.devices, bool) or not isinstance(h.devices, int) or h.devices < 1:
                raise ValueError(
                    f"topology: hosts[{i}].devices must be an integer >= 1, got {h.devices!r}"
                )

    # ---- construction ------------------------------------------------------------------------

    @classmethod
    def single_host(cls, devices: int, link: Link | None = None) -> Topology:
        """One host holding every device (the simulator's default)."""
        return cls((Host("host0", devices),), link, None)

    @classmethod
    def from_spec(
        cls, spec: str, intra_host_link: Link | None = None, inter_host_link: Link | None = None
    ) -> Topology:
        """`48x8` (48 hosts of 8 devices), or several groups: `2x8,1x4`; hosts named host0,
        host1, ... in that order."""
        hosts: list[Host] = []
        for item in spec.split(","):
            m = _SPEC_ITEM.match(item)
            if not m:
                raise ValueError(
                    f"hosts {spec!r}: {item.strip()!r} is not HOSTSxDEVICES (e.g. 48x8, or 2x8,1x4)"
                )
            count, devices = int(m.group(1)), int(m.group(2))
            if count < 1 or devices < 1:
                raise ValueError(f"hosts {spec!r}: {item.strip()!r} needs counts >= 1")
            hosts += [Host(f"host{len(hosts) + k}", devices) for k in range(count)]
        return cls(tuple(hosts), intra_host_link, inter_host_link)

    @classmethod
    def from_json(cls, doc: Any) -> Topology:
        """From the JSON document (parsed); ValueError names the bad field."""
        if not isinstance(doc, dict):
            raise ValueError(f"topology: expected a JSON object, got {type(doc).__name__}")
        unknown = set(doc) - {"hosts", "intra_host_link", "inter_host_link"}
        if unknown:
            raise ValueError(f"topology: unknown field(s) {sorted(unknown)}")
        raw = doc.get("hosts")
        if not isinstance(raw, list) or not raw:
            raise ValueError("topology: hosts must be a non-empty list of {name, devices}")
        hosts = []
        for i, h in enumerate(raw):
            if not isinstance(h, dict) or set(h) - {"name", "devices"}:
                raise ValueError(f"topology: hosts[{i}] must be an object {{name, devices}}")
            hosts.append(Host(h.get("name", f"host{i}"), h.get("devices")))  # type: ignore[arg-type]
        return cls(
            tuple(hosts),
            Link.from_json(doc.get("intra_host_link"), "intra_host_link"),
            Link.from_json(doc.get("inter_host_link"), "inter_host_link"),
        )

    @classmethod
    def loads(cls, text: str) -> Topology:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"topology: not valid JSON: {e}") from None
        return cls.from_json(doc)

    def to_json(self) -> dict[str, Any]:
        def link(x: Link | None) -> Any:
            return None if x is None else x.to_json()

        return {
            "hosts": [{"name": h.name, "devices": h.devices} for h in self.hosts],
            "intra_host_link": link(self.intra_host_link),
            "inter_host_link": link(self.inter_host_link),
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1) + "\n"

    # ---- queries ---------------------------------------------------------------------------

    @property
    def devices(self) -> int:
        return sum(h.devices for h in self.hosts)

    def unit_hosts(self, parallel: int) -> list[tuple[int, ...]]:
        """The hosts each unit of `parallel` devices lies on (one, or the whole hosts it
        spans). ValueError if the devices are not a multiple of `parallel` or a unit would
        cover part of a host."""
        total = self.devices
        if parallel < 1 or total % parallel:
            raise ValueError(
                f"the topology's {total} devices must be a positive multiple of "
                f"--parallel {parallel}"
            )
        first = []  # each host's first device
        at = 0
        for h in self.hosts:
            first.append(at)
            at += h.devices
        out: list[tuple[int, ...]] = []
        host = 0
        for u in range(total // parallel):
            lo, hi = u * parallel, (u + 1) * parallel  # devices [lo, hi)
            while first[host] + self.hosts[host].devices <= lo:
                host += 1
            span = [host]
            while first[span[-1]] + self.hosts[span[-1]].devices < hi:
                span.append(span[-1] + 1)
            if len(span) > 1 and (
                first[span[0]] != lo or first[span[-1]] + self.hosts[span[-1]].devices != hi
            ):
                names = ", ".join(self.hosts[h].name for h in span)
                raise ValueError(
                    f"unit {u} (devices {lo}-{hi - 1}) would straddle hosts {names}: "
                    f"--parallel {parallel} must divide every host's device count or be a "
                    "multiple of it (a unit spans whole hosts)"
                )
            out.append(tuple(span))
        return out

    def host_of(self, unit: int, parallel: int) -> int:
        """The (first) host of `unit`."""
        hosts = self.unit_hosts(parallel)
        if not 0 <= unit < len(hosts):
            raise ValueError(f"unit {unit} out of range [0, {len(hosts)})")
        return hosts[unit][0]

    def same_host(self, unit_a: int, unit_b: int, parallel: int) -> bool:
        """Whether KV between the two units stays within a host (the same unit, or units of
        one host); units spanning whole hosts share none with another unit."""
        hosts = self.unit_hosts(parallel)
        return hosts[unit_a] == hosts[unit_b]

    def link_between(self, unit_a: int, unit_b: int, parallel: int) -> Link | None:
        """The link KV takes from `unit_a` to `unit_b`: the intra-host one within a host, else
        the inter-host one (None: unknown)."""
        if self.same_host(unit_a, unit_b, parallel):
            return self.intra_host_link
        return self.inter_host_link

    def placement_domains(self, parallel: int) -> list[list[int]]:
        """The units one placer sees, in unit order: a host's units (a placer places over its
        own host's devices only), or a unit spanning hosts alone."""
        domains: dict[tuple[int, ...], list[int]] = {}
        for u, hosts in enumerate(self.unit_hosts(parallel)):
            domains.setdefault(hosts, []).append(u)
        return list(domains.values())


def hosts_devices(hosts: Sequence[Host]) -> str:
    """`48x8`-style summary of the hosts (runs of equal counts)."""
    runs: list[list[int]] = []
    for h in hosts:
        if runs and runs[-1][1] == h.devices:
            runs[-1][0] += 1
        else:
            runs.append([1, h.devices])
    return ",".join(f"{n}x{d}" for n, d in runs)
