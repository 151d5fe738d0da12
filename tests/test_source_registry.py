"""One way to add a source: typed settings per source, one registration point, flags in the CLI."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from verl_top.inputs import InputError, add_input_arguments, build_inputs
from verl_top.sources import registry
from verl_top.sources.prometheus import PrometheusSource, PromSettings

SOURCES_DIR = Path(__file__).resolve().parents[1] / "verl_top" / "sources"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_input_arguments(parser)
    return parser.parse_args(list(argv))


def test_registry_builds_from_settings_alone() -> None:
    sources = registry.build(PromSettings(url="http://127.0.0.93:9090", selector='job="dcgm"'))
    assert len(sources) == 1 and isinstance(sources[0], PrometheusSource)
    assert sources[0].settings.selector == 'job="dcgm"'
    with pytest.raises(KeyError, match="no source registered"):
        registry.build(object())


def test_every_registered_module_has_settings_and_build_sources() -> None:
    import importlib

    for kind, module_name in registry.SOURCES.items():
        module = importlib.import_module(module_name)
        assert callable(module.build_sources), module_name
        kinds = [
            v.KIND
            for v in vars(module).values()
            if isinstance(v, type) and isinstance(getattr(v, "KIND", None), str)
        ]
        assert kind in kinds, (module_name, kinds)


def test_no_source_reads_an_argparse_namespace() -> None:
    """argparse stays in the CLI: no source module takes or builds from a Namespace."""
    for path in SOURCES_DIR.glob("*.py"):
        tree = ast.parse(path.read_text())
        names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert "Namespace" not in names, f"{path.name} still handles argparse.Namespace"


def test_cli_maps_prometheus_flags_and_skips_the_local_machine() -> None:
    inputs = build_inputs(
        parse(
            "--prometheus", "127.0.0.93:9090", "--prom-selector", 'namespace="train"',
            "--prom-interval", "2",
        )
    )  # fmt: skip
    assert [type(s).__name__ for s in inputs.sources] == ["PrometheusSource"]
    s = inputs.sources[0].settings
    assert (s.url, s.selector, s.interval) == ("http://127.0.0.93:9090", 'namespace="train"', 2.0)
    assert "127.0.0.93" in inputs.title


def test_prometheus_mixes_with_a_local_verl_log(tmp_path: Path) -> None:
    log = tmp_path / "driver.log"
    log.write_text("")
    inputs = build_inputs(parse("--prometheus", "http://127.0.0.93:9090", "--verl-log", str(log)))
    assert sorted(type(s).__name__ for s in inputs.sources) == [
        "LocalFollowSource",
        "PrometheusSource",
    ]


def test_bad_prometheus_flags_are_one_sentence() -> None:
    with pytest.raises(InputError, match="--prom-selector"):
        build_inputs(parse("--prometheus", "http://x:9090", "--prom-selector", "job=dcgm"))
    with pytest.raises(InputError, match="--prometheus"):
        build_inputs(parse("--prometheus", "ftp://x"))
