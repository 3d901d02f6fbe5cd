"""serving/topology.py: a cluster's hosts and links, its JSON and spec string, which host each
unit of `parallel` devices lies on and which link KV between two units takes."""

from __future__ import annotations

import json

import pytest

from flexnpu.serving.topology import Host, Link, Topology, hosts_devices


def test_spec_string_names_hosts_in_device_order() -> None:
    t = Topology.from_spec("48x8", Link("hccs"), Link("roce"))
    assert len(t.hosts) == 48 and t.devices == 384
    assert t.hosts[0] == Host("host0", 8) and t.hosts[47] == Host("host47", 8)
    mixed = Topology.from_spec(" 2x8 , 1X4")
    assert mixed.hosts == (Host("host0", 8), Host("host1", 8), Host("host2", 4))
    assert hosts_devices(mixed.hosts) == "2x8,1x4"
    assert mixed.intra_host_link is None and mixed.inter_host_link is None


@pytest.mark.parametrize(
    "spec, message",
    [
        ("48", "'48' is not HOSTSxDEVICES"),
        ("2x8,", "'' is not HOSTSxDEVICES"),
        ("0x8", "'0x8' needs counts >= 1"),
        ("2x0", "'2x0' needs counts >= 1"),
        ("2x-1", "'2x-1' is not HOSTSxDEVICES"),
    ],
)
def test_bad_spec_strings_are_refused_by_message(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Topology.from_spec(spec)


def test_units_lie_on_hosts_and_take_the_link_between_them() -> None:
    t = Topology.from_spec("2x4", Link("nvlink"), Link("roce"))
    # parallel 2: units 0, 1 on host0, 2, 3 on host1
    assert t.unit_hosts(2) == [(0,), (0,), (1,), (1,)]
    assert [t.host_of(u, 2) for u in range(4)] == [0, 0, 1, 1]
    assert t.link_between(0, 1, 2) == Link("nvlink")
    assert t.link_between(1, 2, 2) == Link("roce")
    assert t.placement_domains(2) == [[0, 1], [2, 3]]
    # parallel 8 = two whole hosts: one unit spanning both
    assert t.unit_hosts(8) == [(0, 1)] and t.placement_domains(8) == [[0]]
    # 4 hosts of 4, parallel 8: each unit spans two whole hosts; KV between units crosses
    t4 = Topology.from_spec("4x4", Link("hccs"), Link("roce"))
    assert t4.unit_hosts(8) == [(0, 1), (2, 3)]
    assert t4.same_host(0, 0, 8) and not t4.same_host(0, 1, 8)
    assert t4.placement_domains(8) == [[0], [1]]


def test_a_unit_straddling_hosts_is_refused() -> None:
    with pytest.raises(
        ValueError, match=r"unit 0 \(devices 0-5\) would straddle hosts host0, host1"
    ):
        Topology.from_spec("1x4,1x8").unit_hosts(6)
    with pytest.raises(
        ValueError,
        match=r"unit 1 \(devices 4-7\) would straddle hosts host0, "
        r"host1: --parallel 4 must divide",
    ):
        Topology.from_spec("1x6,1x2").unit_hosts(4)
    with pytest.raises(
        ValueError, match="the topology's 8 devices must be a positive multiple of --parallel 3"
    ):
        Topology.from_spec("2x4").unit_hosts(3)


def test_json_round_trip_with_named_and_measured_links() -> None:
    t = Topology(
        (Host("a", 8), Host("b", 4)),
        Link("hccs"),
        Link("measured", 1.5e9, 2e-5, "3 KV handoffs"),
    )
    doc = t.to_json()
    assert doc == {
        "hosts": [{"name": "a", "devices": 8}, {"name": "b", "devices": 4}],
        "intra_host_link": "hccs",
        "inter_host_link": {
            "bytes_per_s": 1.5e9,
            "latency_s": 2e-5,
            "name": "measured",
            "source": "3 KV handoffs",
        },
    }
    assert Topology.loads(json.dumps(doc)) == t
    assert Topology.loads(t.dumps()) == t
    unknown = Topology.from_json({"hosts": [{"devices": 2}], "inter_host_link": None})
    assert unknown.hosts == (Host("host0", 2),) and unknown.inter_host_link is None


@pytest.mark.parametrize(
    "doc, message",
    [
        ([], "expected a JSON object, got list"),
        ({"hosts": []}, "hosts must be a non-empty list"),
        ({"hosts": [{"devices": 8}], "links": 1}, r"unknown field\(s\) \['links'\]"),
        (
            {"hosts": [{"name": "a", "devices": 0}]},
            r"hosts\[0\].devices must be an integer >= 1, "
            "got 0",
        ),
        ({"hosts": [{"devices": 8}, {"devices": 2.5}]}, r"hosts\[1\].devices must be an integer"),
        ({"hosts": [{"devices": 8, "gpus": 2}]}, r"hosts\[0\] must be an object \{name, devices\}"),
        ({"hosts": [{"name": "", "devices": 8}]}, r"hosts\[0\].name must be a non-empty string"),
        ({"hosts": [{"devices": 8}], "inter_host_link": 5}, "inter_host_link must be a link name"),
        (
            {"hosts": [{"devices": 8}], "inter_host_link": {"bytes_per_s": -1}},
            r"inter_host_link.bytes_per_s must be a number > 0, got -1",
        ),
        (
            {"hosts": [{"devices": 8}], "intra_host_link": {"bytes_per_s": 1e9, "latency_s": -1}},
            r"intra_host_link.latency_s must be a number >= 0",
        ),
        (
            {"hosts": [{"devices": 8}], "intra_host_link": {"bytes_per_s": 1e9, "speed": 1}},
            r"intra_host_link has unknown field\(s\) \['speed'\]",
        ),
    ],
)
def test_bad_json_names_the_field(doc, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Topology.from_json(doc)


def test_not_json_is_refused() -> None:
    with pytest.raises(ValueError, match="topology: not valid JSON"):
        Topology.loads("{hosts: 1}")
