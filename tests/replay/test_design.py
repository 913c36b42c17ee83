"""Network design files (emu/replay/config/design.py): every refusal names the file, the key and the fix;
a design lays over the defaults and under the flags; what a run used writes back as a design that
reads back the same; and fuzzing: whatever the text, a design or one ConfigError line."""

from __future__ import annotations

import datetime
import math
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emu.emulator import fabric as fabrics
from emu.emulator.links.spec import LinkSpec
from emu.errors import ConfigError
from emu.replay.config.design import (
    FLAG_KEYS,
    KEYS,
    MAX_DESIGN_BYTES,
    NetworkDesign,
    load_design,
    parse_design,
    resolved_design,
)
from emu.replay.config.options import ReplayConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "designs"
# Deterministic (the same inputs on every run, so a failure reproduces) and quick.
FAST = settings(max_examples=200, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def refused(text: str, *parts: str, source: str = "d.toml") -> str:
    """The one-line message parse_design gives ``text``, checked to hold the file and ``parts``."""
    with pytest.raises(ConfigError) as info:
        parse_design(text, source)
    msg = str(info.value)
    assert msg.startswith(f"{source}: ") and "\n" not in msg, msg
    for part in parts:
        assert part in msg, (part, msg)
    return msg


# ---- the examples and a plain design ----

@pytest.mark.parametrize("name", ["ina-100g.toml", "ring-100g.toml", "ina-25g-lossy.toml", "nodes-8x-ina.toml",
                                  "topology/ina-flat-1to1.toml", "topology/ina-flat-4to1.toml",
                                  "topology/ina-hierarchical-4to1.toml", "topology/ring-flat-4to1.toml",
                                  "jobs/shared-spine-4to1.toml"])
def test_examples_parse_and_check(name: str) -> None:
    path = EXAMPLES / name
    assert path.read_text().startswith("# "), "each example opens with a comment header line"
    design = load_design(path)
    assert design.path == str(path) and design.value("fabric")
    assert design.name == name.removesuffix(".toml") or name.startswith(("topology/", "jobs/"))
    design.overlay(ReplayConfig(), frozenset()).check()


def test_examples_values() -> None:
    lossy = load_design(EXAMPLES / "ina-25g-lossy.toml")
    assert [lossy.value(k) for k in ("fabric", "link.bandwidth", "link.loss", "link.jitter")] == ["ina", 25e9, 0.001, 2.0]
    assert load_design(EXAMPLES / "ring-100g.toml").value("fabric") == "ring"


def test_every_key() -> None:
    d = parse_design('name = "n"\ndescription = "d"\nfabric = "ps"\n[link]\nbandwidth = "12.5GBps"\n'
                     'latency = "1ms"\nloss = 0.01\njitter = "500ns"\n[switch]\nslots = 8192\nelements = 256\n',
                     "x.toml")
    assert d == NetworkDesign.of("x.toml", "n", "d", {"fabric": "ps", "link.bandwidth": 100e9, "link.latency": 1000.0,
                                                      "link.loss": 0.01, "link.jitter": 0.5, "switch.slots": 8192,
                                                      "switch.elements": 256})
    assert [d.value(k) for k in KEYS] == ["ps", 100e9, None, 1000.0, 0.01, 0.5, 8192, 256] + [None] * 12


def test_a_bandwidth_schedule() -> None:
    d = parse_design('[link]\nbandwidth_schedule = "0s:100Gbps,20ms:10Gbps"\n', "s.toml")
    assert d.value("link.bandwidth_schedule") == ((0.0, 100e9), (20_000.0, 10e9))
    assert d.value("link.bandwidth") is None
    config = d.overlay(ReplayConfig(), frozenset())
    config.check()
    assert config.link.schedule == d.value("link.bandwidth_schedule") and config.link.bandwidth_bps == 100e9
    assert resolved_design(config)["link"]["bandwidth_schedule"] == [[0.0, 100e9], [20_000.0, 10e9]]
    with pytest.raises(ConfigError, match="drop --bandwidth"):
        d.overlay(ReplayConfig(), frozenset({"link.bandwidth"}))
    for text, words in [('bandwidth = "10Gbps"\nbandwidth_schedule = "0s:10Gbps"', "keep one"),
                        ('bandwidth_schedule = "1s:10Gbps"', "from 0s"), ("bandwidth_schedule = 5", "a string")]:
        with pytest.raises(ConfigError, match="s.toml: link.") as err:
            parse_design(f"[link]\n{text}\n", "s.toml")
        assert words in str(err.value)


def test_empty_and_partial() -> None:
    refused("\ufeff# only a comment\n[link]\n", "sets nothing", source="e.toml")  # issue 37: was the defaults
    d = parse_design('link.bandwidth = "ideal"\nswitch.elements = 64\n', "e.toml")
    assert d.value("link.bandwidth") == math.inf and d.value("switch.elements") == 64
    assert d.value("link.latency") is None
    assert parse_design("[link]\nloss = 0\n", "e.toml").value("link.loss") == 0.0


# ---- refusals: file, key, fix ----

def test_unknown_keys_suggest_the_closest() -> None:
    refused('[link]\nbandwith = "1Gbps"\n', "link.bandwith", "did you mean link.bandwidth?",
            "bandwidth, bandwidth_schedule, latency, loss, jitter")
    refused('bandwidth = "1Gbps"\n', "unknown key bandwidth", "did you mean link.bandwidth?", "[link]")
    refused("[link]\nslots = 4\n", "link.slots", "did you mean switch.slots?")
    refused('fabrik = "ina"\n', "fabrik", "did you mean fabric?")
    refused("[swich]\nslots = 4\n", "swich", "did you mean switch?")
    refused("[switch.extra]\na = 1\n", "switch.extra", "slots, elements")
    refused('"a b" = 1\n', "'a b'", "name, description, fabric, [link], [switch], [topology], [jobs] and [parallelism]")


def test_topology_keys() -> None:
    design = parse_design('[topology]\nworkers_per_node = 4\nnics_per_node = 2\nintra_node_bandwidth = "300GBps"\n'
                          'intra_node_latency = "2us"\nleaf_ports = 16\nplacement = [0, 1, 0, 1]\n'
                          'spine_latency = "3us"\n', "d.toml")
    config = design.overlay(ReplayConfig(workers=4), frozenset())
    topo = config.topology
    assert topo is not None and (topo.workers_per_node, topo.nics_per_node, topo.leaf_ports) == (4, 2, 16)
    assert topo.intra == LinkSpec(bandwidth_bps=2.4e12, latency_us=2.0) and topo.nodes == (0, 1, 0, 1)
    assert topo.spine_latency_us == 3.0
    config.check()
    assert resolved_design(config)["topology"]["placement"] == [0, 1, 0, 1]
    refused("topology = 1\n", "topology = 1", "[topology] table")
    refused("[topology]\nnodes = 4\n", "topology.nodes", "workers_per_node")
    refused("[topology]\nworkers_per_node = 0\n", "topology.workers_per_node = 0", "1..1024")
    refused('[topology]\nplacement = "sideways"\n', "topology.placement", '"packed", "spread"')
    refused('[topology]\nalgorithm = "tree"\n', "topology.algorithm", '"flat" or "hierarchical"')
    refused("[topology]\noversubscription = 0.5\n", "topology.oversubscription = 0.5", "2 for 2:1")
    hier = parse_design('[topology]\nalgorithm = "hierarchical"\n', "d.toml")
    hier.overlay(ReplayConfig(fabric="ina"), frozenset()).check()
    with pytest.raises(ConfigError, match="on the fabric ps: it has no hierarchical variant"):
        hier.overlay(ReplayConfig(fabric="ps"), frozenset()).check()  # refused by the run's check


def test_wrong_types() -> None:
    refused("[link]\nbandwidth = 100\n", "link.bandwidth = 100", "no unit", 'give a string like "100Gbps"')
    refused("[link]\nbandwidth = true\n", "link.bandwidth", "a boolean", '"100Gbps"')
    refused('[link]\nloss = "1%"\n', "link.loss = '1%'", "a string", "give a number such as 0.01")
    refused("[link]\nloss = true\n", "link.loss", "a boolean", "0.01")
    refused("[link]\nlatency = 5\n", "link.latency = 5", "no unit", '"5us"')
    refused("[link]\njitter = [1]\n", "link.jitter", "an array", '"5us"')
    refused("[switch]\nslots = 4096.0\n", "switch.slots = 4096.0", "a float", "whole number such as 4096")
    refused('[switch]\nelements = "64"\n', "switch.elements", "a string", "whole number")
    refused("fabric = 1\n", "fabric = 1", "an integer", "ina")
    refused("name = 1979-05-27\n", "name = datetime.date(1979, 5, 27)", "a date", "give a string")
    refused('link = "fast"\n', "link = 'fast'", "a string", "write a [link] table")
    refused('[[switch]]\nslots = 1\n', "switch = [...]", "an array", "[switch] table")
    refused('name = "a\\nb"\n', "name", "control character", "one line")


def test_out_of_range() -> None:
    refused('[link]\nbandwidth = "0Gbps"\n', "link.bandwidth = '0Gbps'", "1kbps to 100Tbps", "ideal")
    refused('[link]\nbandwidth = "fast"\n', "link.bandwidth = 'fast'", '"100Gbps"')
    refused('[link]\nlatency = "2d"\n', "link.latency = '2d'", "a duration with a unit", '"5us"')
    refused('[link]\njitter = "90000s"\n', "link.jitter", "at most a day")
    for loss in ("1.0", "-0.1", "nan", "inf", "1"):
        refused(f"[link]\nloss = {loss}\n", "link.loss", "[0, 1)")
    for slots in ("0", "16777217", "-1", "9" * 100):
        refused(f"[switch]\nslots = {slots}\n", "switch.slots", "1..16777216")
    refused("[switch]\nelements = 128\n", "switch.elements = 128", "64 or 256")
    refused('fabric = "inaa"\n', "fabric = 'inaa'", "did you mean ina?", "ring")


def test_syntax_errors_and_sizes() -> None:
    refused("[link]\nbandwidth = 100Gbps\n", "not valid TOML", "line 2, column", "need quotes")
    msg = refused('[link]\nbandwidth = "1Gbps"\nbandwidth = "2Gbps"\n', "Cannot overwrite", "given twice: keep one")
    assert "quotes" not in msg  # issue 37: a duplicate key was told to quote its text
    refused("a = " + "[" * 5000, "too deeply")
    refused("[switch]\nslots = " + "9" * 5000 + "\n", "thousands of digits", "ordinary size")
    refused("# " + "x" * MAX_DESIGN_BYTES, "larger than", "a few lines")


def test_file_problems(tmp_path: Path) -> None:
    def message(path: Any) -> str:
        with pytest.raises(ConfigError) as info:
            load_design(path)
        msg = str(info.value)
        assert msg.startswith(f"{os.fspath(path)}: ") and "\n" not in msg, msg
        return msg

    assert "no such file" in message(tmp_path / "missing.toml")
    assert "is a directory" in message(tmp_path)
    bad = tmp_path / "latin1.toml"
    bad.write_bytes('name = "caf\xe9"\n'.encode("latin-1"))
    assert "not UTF-8" in message(bad) and "save the design as UTF-8" in message(bad)
    big = tmp_path / "big.toml"
    big.write_bytes(b"#" * (MAX_DESIGN_BYTES + 1))
    assert "larger than" in message(big)
    broken = tmp_path / "broken.toml"
    broken.write_text("[link\n")
    assert "not valid TOML" in message(str(broken))
    good = tmp_path / "good.toml"
    good.write_text('fabric = "ring"\n')
    assert load_design(str(good)).value("fabric") == "ring" and load_design(good).path == str(good)


# ---- overlay: design over defaults, flags over design ----

DESIGN = NetworkDesign.of("d.toml", values={"fabric": "ring", "link.bandwidth": 25e9, "link.latency": 10.0,
                                           "link.loss": 0.01, "link.jitter": 1.0, "switch.slots": 1024,
                                           "switch.elements": 256})


def test_overlay_design_over_defaults() -> None:
    config = DESIGN.overlay(ReplayConfig(workers=4), frozenset())
    assert config.workers == 4 and config.fabric == "ring" and (config.slots, config.elements) == (1024, 256)
    assert config.link == LinkSpec(bandwidth_bps=25e9, latency_us=10.0, loss=0.01, jitter_us=1.0)
    config.check()


def test_overlay_flags_win() -> None:
    typed = ReplayConfig(fabric="ps", link=LinkSpec(bandwidth_bps=1e9, loss=0.2), slots=64)
    config = DESIGN.overlay(typed, frozenset({"fabric", "link.bandwidth", "link.loss", "switch.slots"}))
    assert (config.fabric, config.link.bandwidth_bps, config.link.loss, config.slots) == ("ps", 1e9, 0.2, 64)
    assert (config.link.latency_us, config.link.jitter_us, config.elements) == (10.0, 1.0, 256)
    everything = DESIGN.overlay(typed, frozenset(KEYS))
    assert everything == typed


def test_overlay_unset_keys_keep_the_config() -> None:
    config = ReplayConfig(link=LinkSpec(latency_us=7.0))
    assert NetworkDesign().overlay(config, frozenset()) is config
    assert NetworkDesign.of(values={"link.loss": 0.1}).overlay(config, frozenset()).link == LinkSpec(latency_us=7.0,
                                                                                                     loss=0.1)
    with pytest.raises(ValueError):
        DESIGN.overlay(config, frozenset({"bandwidth"}))  # a flag name, not a key: a caller's mistake
    assert set(KEYS) <= set(FLAG_KEYS.values())  # every key that sets the configuration has its flag


# ---- resolved_design ----

def test_resolved_design() -> None:
    config = DESIGN.overlay(ReplayConfig(), frozenset())
    assert resolved_design(config, DESIGN) == {
        "file": "d.toml", "name": None, "fabric": "ring",
        "link": {"bandwidth_bps": 25e9, "latency_us": 10.0, "loss": 0.01, "jitter_us": 1.0},
        "switch": {"slots": 1024, "elements": 256}}
    ideal = resolved_design(ReplayConfig(link=LinkSpec(bandwidth_bps=math.inf)), None)
    assert ideal["file"] is None and ideal["link"]["bandwidth_bps"] is None
    assert ideal["switch"] == {"slots": ReplayConfig().emulated_slots, "elements": 64}


# ---- fuzzing ----

@FAST
@given(st.text(max_size=300)
       | st.lists(st.sampled_from(['fabric = "ina"', "[link]", "[switch]", 'bandwidth = "1Gbps"', "loss = 0.5",
                                   "slots = 7", "elements = 256", "[topology]", "= 1", '"', "[", "]", "{",
                                   'latency = "1 ms"', "jitter = 3", "x.y = 1", "name = 'n'", "\x00", "\ufeff"]),
                  max_size=12).map("\n".join))
def test_fuzz_any_text(text: str) -> None:
    try:
        parse_design(text, "f.toml")
    except ConfigError as exc:
        assert str(exc).startswith("f.toml: ") and "\n" not in str(exc)


def toml_value(value: Any) -> str:
    """A value as a TOML inline value (tables inline), for documents of any shape."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, (int, datetime.date, datetime.time)):
        return value.isoformat() if not isinstance(value, int) else str(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    return "{" + ", ".join(f"{toml_string(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_string(text: str) -> str:
    return '"' + "".join(f"\\u{ord(c):04x}" if ord(c) < 32 or c in '"\\\x7f' else c for c in text) + '"'


def toml_document(doc: dict[str, Any]) -> str:
    """Top-level scalars first, then each table as [table] (its own tables inline)."""
    lines = [f"{toml_string(k)} = {toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    for k, v in doc.items():
        if isinstance(v, dict):
            lines += [f"[{toml_string(k)}]", *(f"{toml_string(kk)} = {toml_value(vv)}" for kk, vv in v.items())]
    return "\n".join(lines) + "\n"


KEY_NAMES = st.sampled_from(["fabric", "name", "description", "link", "switch", "topology", "bandwidth",
                             "latency", "loss", "jitter", "slots", "elements"]) | st.text(max_size=8)
toml_scalars = (st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
                | st.sampled_from(["ina", "ring", "100Gbps", "ideal", "5us", "0", 64, 256, 4096, 0.5, 1 << 24])
                | st.dates() | st.datetimes(timezones=st.none()) | st.times())
toml_values = st.recursive(toml_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(KEY_NAMES, inner, max_size=3), max_leaves=8)


@FAST
@given(st.dictionaries(KEY_NAMES, toml_values, max_size=5))
def test_fuzz_toml_documents(doc: dict[str, Any]) -> None:
    text = toml_document(doc)
    try:
        parse_design(text, "f.toml")
    except ConfigError as exc:
        assert str(exc).startswith("f.toml: ") and "\n" not in str(exc), str(exc)


UNITS = {"bps": 1.0, "kbps": 1e3, "Mbps": 1e6, "Gbps": 1e9, "Tbps": 1e12, "GBps": 8e9, "Gbit": 1e9}
NAME_CHARS = st.characters(blacklist_categories=("Cc", "Cs"))  # one line: what a name may hold
TIMES = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


@st.composite
def rate(draw: st.DrawFn) -> tuple[str, float]:
    if draw(st.booleans()) and draw(st.booleans()):
        return "ideal", math.inf
    unit = draw(st.sampled_from(sorted(UNITS)))
    scale = 8.0 if unit[1:].startswith("B") else 1.0  # parse_bandwidth's order: number, prefix, bits
    prefix = UNITS[unit] / scale
    n = draw(st.integers(max(1, math.ceil(1e3 / UNITS[unit])), int(1e14 // UNITS[unit])))
    return f"{n}{unit}", float(n) * prefix * scale


@st.composite
def duration(draw: st.DrawFn) -> tuple[str, float]:
    unit = draw(st.sampled_from(sorted(TIMES)))
    n = draw(st.integers(0, int(86400e6 / TIMES[unit])))
    return f"{n}{unit}", float(n) * TIMES[unit]


@FAST
@given(st.fixed_dictionaries({}, optional={
    "fabric": st.sampled_from(fabrics.names()), "name": st.text(NAME_CHARS, max_size=10),
    "link.bandwidth": rate(), "link.latency": duration(), "link.jitter": duration(),
    "link.loss": st.floats(0, 1, exclude_max=True), "switch.slots": st.integers(1, 1 << 24),
    "switch.elements": st.sampled_from([64, 256])}).filter(lambda v: set(v) - {"name"}))  # one key set at least
def test_fuzz_valid_designs_parse_to_their_values(values: dict[str, Any]) -> None:
    lines, tables = [], {"link": [], "switch": []}
    for key, value in values.items():
        text = value[0] if isinstance(value, tuple) else value
        line = f"{toml_string(text) if isinstance(text, str) else toml_value(text)}"
        if "." in key:
            tables[key.split(".")[0]].append(f"{key.split('.')[1]} = {line}")
        else:
            lines.append(f"{key} = {line}")
    for table, body in tables.items():
        if body:
            lines += [f"[{table}]", *body]
    design = parse_design("\n".join(lines), "v.toml")
    for key in KEYS:
        want = values.get(key)
        assert design.value(key) == (want[1] if isinstance(want, tuple) else want), key
    assert design.name == values.get("name")


def test_a_layout_in_a_design() -> None:
    """[parallelism] mesh: the layout of a sharded or split trace, which sets the workers (docs/parallelism.md)."""
    d = parse_design('[parallelism]\nmesh = "dp=16,tp=2"\n', "p.toml")
    assert d.value("parallelism.mesh") is not None and d.value("parallelism.mesh").text() == "dp=16,tp=2"
    config = d.overlay(ReplayConfig(), frozenset())
    assert config.mesh == d.value("parallelism.mesh") and config.workers == 32
    assert resolved_design(config)["parallelism"] == {"mesh": "dp=16,tp=2"}
    assert "parallelism" not in resolved_design(ReplayConfig())
    refused('[parallelism]\nmesh = 4\n', "parallelism.mesh", "give the layout as a string of NAME=SIZE pairs")
    refused('[parallelism]\nmesh = "dp=0"\n', "parallelism.mesh", "give the mesh as NAME=SIZE pairs")
    refused('[parallelism]\nlayout = "dp=2"\n', "parallelism.layout", "[parallelism] takes mesh")


def test_an_empty_design_is_refused() -> None:
    """An empty file, or one of comments only, sets nothing: a mistake more likely than a wish for the
    defaults, which no --network gives (issue 37)."""
    refused("", "sets nothing", "give no --network")
    refused("# a design to fill in\n\n", "sets nothing")
    refused('name = "x"\ndescription = "to do"\n', "sets nothing")  # labels alone set no network
    assert parse_design('name = "x"\nfabric = "ring"\n', "d.toml").name == "x"
