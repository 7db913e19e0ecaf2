"""The grafana/ artefacts: the dashboard JSON is exactly what grafana/dashboard.py
generates; the alert rules pass `promtool check rules` and their unit tests (`promtool
test rules`); the Prometheus config template renders to a valid config; and every metric
the dashboard, the rules and the README name is one the controller exports (or one of the
documented broker gauges)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from prometheus_client import Metric

from controller.runtime.metrics_server import RoleMetrics
from tests.observability.kit import (
    GRAFANA,
    NO_PROMTOOL,
    PROMTOOL,
    Cluster,
    render_prometheus_config,
)

BROKER_METRICS = {"metactl_broker_metadata_lag_records", "metactl_broker_metadata_lag_seconds"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMTOOL)


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("metactl_dashboard", GRAFANA / "dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dashboard_json_is_regenerated_byte_for_byte() -> None:
    generator = load_generator()
    checked_in = (GRAFANA / "metactl-dashboard.json").read_bytes()
    assert generator.render().encode("utf-8") == checked_in, (
        "grafana/metactl-dashboard.json is stale: run .venv/bin/python grafana/dashboard.py"
    )
    assert generator.render() == generator.render()  # deterministic
    assert generator.main(["--check"]) == 0


def dashboard() -> dict[str, object]:
    doc: dict[str, object] = json.loads((GRAFANA / "metactl-dashboard.json").read_text())
    return doc


def panels() -> list[dict[str, object]]:
    out = dashboard()["panels"]
    assert isinstance(out, list)
    return out


def dashboard_exprs() -> list[str]:
    exprs = [t["expr"] for p in panels() for t in p.get("targets", [])]  # type: ignore[attr-defined]
    exprs += [a["expr"] for a in dashboard()["annotations"]["list"] if "expr" in a]  # type: ignore[index]
    return exprs


def test_dashboard_has_the_panels_and_the_data_loss_annotation() -> None:
    titles = [p["title"] for p in panels() if p["type"] != "row"]
    assert titles[:6] == [
        "Active brokers",
        "Fenced brokers",
        "Offline partitions",
        "Under MinISR",
        "Pending unclean recoveries",
        "Potential data-loss events",
    ]
    for needed in (
        "Elections by kind",
        "Partitions on ELR and LastKnownELR",
        "Commit latency",
        "Event queue time",
        "Log end offset",
        "Broker metadata lag (records)",
        "Broker metadata lag (seconds)",
        "Event queue time p99 by event",
        "Event processing time p99 by event",
        "Event in progress",
        "Reassignments in progress",
        "Oldest reassignment in progress",
        "Lifecycle operations",
        "ELR feature level",
    ):
        assert needed in titles
    loss = next(p for p in panels() if p["title"] == "Potential data-loss events")
    assert loss["targets"][0]["expr"] == (  # type: ignore[index]
        'sum(increase(metactl_potential_data_loss_events_total{job=~"$job"}[$__range]))'
    )
    steps = loss["fieldConfig"]["defaults"]["thresholds"]["steps"]  # type: ignore[index]
    assert steps == [{"value": None, "color": "green"}, {"value": 1, "color": "red"}]
    annotations = dashboard()["annotations"]["list"]  # type: ignore[index]
    marker = next(a for a in annotations if a["name"] == "Potential data loss")
    assert "filter" not in marker  # shown on every panel
    assert "metactl_potential_data_loss_events_total" in marker["expr"]
    assert marker["tagKeys"] == "topic,strategy" and "{{topic}}" in marker["titleFormat"]
    # Every panel and query reads the chosen Prometheus data source; ids are unique.
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids))
    for p in panels():
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_lifecycle_row_shows_reassignments_in_progress() -> None:
    rows = [p["title"] for p in panels() if p["type"] == "row"]
    assert "Metadata lifecycle" in rows
    moving = next(p for p in panels() if p["title"] == "Reassignments in progress")
    assert [t["expr"] for t in moving["targets"]] == [  # type: ignore[attr-defined]
        'sum(metactl_partitions_reassigning{job=~"$job"})'
    ]
    oldest = next(p for p in panels() if p["title"] == "Oldest reassignment in progress")
    assert oldest["fieldConfig"]["defaults"]["unit"] == "s"  # type: ignore[index]
    ops = next(p for p in panels() if p["title"] == "Lifecycle operations")
    named = metric_names(" ".join(t["expr"] for t in ops["targets"]))  # type: ignore[attr-defined]
    assert named == {
        "metactl_reassignments_total",
        "metactl_topics_deleted_total",
        "metactl_brokers_unregistered_total",
        "metactl_elr_clears_total",
    }


def test_event_loop_row_shows_p99_by_event_type() -> None:
    rows = [p["title"] for p in panels() if p["type"] == "row"]
    assert "Event loop" in rows
    for title, metric in (
        ("Event queue time p99 by event", "metactl_event_queue_time_seconds_bucket"),
        ("Event processing time p99 by event", "metactl_event_processing_time_seconds_bucket"),
    ):
        panel = next(p for p in panels() if p["title"] == title)
        targets = panel["targets"]
        assert isinstance(targets, list) and len(targets) == 1
        target = targets[0]
        assert target["expr"] == (
            f'histogram_quantile(0.99, sum by (event, le) (rate({metric}{{job=~"$job"}}'
            "[$__rate_interval])))"
        )
        assert target["legendFormat"] == "{{event}}"
        assert panel["fieldConfig"]["defaults"]["unit"] == "s"  # type: ignore[index]


def metric_names(text: str) -> set[str]:
    return set(re.findall(r"\bmetactl_[a-z_]*[a-z]", text))


async def served(tmp_path: Path) -> list[Metric]:
    """What an active controller's `/metrics` serves: its role's registry, delegating to
    the controller's metrics."""
    c = await Cluster.open(tmp_path)
    try:
        role = RoleMetrics()
        role.active(c.metrics)
        return list(role.registry.collect())
    finally:
        await c.close()


async def exported_names(tmp_path: Path) -> set[str]:
    families = await served(tmp_path)
    names = {m.name for m in families} | {s.name for m in families for s in m.samples}
    return names | {m.name + "_total" for m in families if m.type == "counter"}


async def test_every_metric_named_in_grafana_exists(tmp_path: Path) -> None:
    exported = await exported_names(tmp_path) | BROKER_METRICS
    named = metric_names("\n".join(dashboard_exprs()))
    named |= metric_names((GRAFANA / "alerts.yml").read_text())
    named |= metric_names((GRAFANA / "README.md").read_text())
    # Histograms are named by family in prose; their series carry the suffixes.
    unknown = {
        n
        for n in named
        if n not in exported and not any(n + s in exported for s in HISTOGRAM_SUFFIXES)
    }
    assert not unknown, f"named in grafana/ but not exported: {sorted(unknown)}"


async def test_readme_documents_every_exported_metric(tmp_path: Path) -> None:
    collected = await served(tmp_path)
    families = {m.name for m in collected}
    kinds = {m.name: m.type for m in collected}
    readme = (GRAFANA / "README.md").read_text()
    for name in families:
        full = name + "_total" if kinds[name] == "counter" else name
        assert f"`{full}`" in readme, f"{full} is not documented in grafana/README.md"
    for name in BROKER_METRICS:
        assert f"`{name}`" in readme


def readme_metrics_table() -> set[str]:
    """The metric names in the first column of the README's Metrics table."""
    readme = (GRAFANA.parent / "README.md").read_text()
    section = readme[readme.index("\n## Metrics\n") :]
    end = section.find("\n## ", 1)
    rows = [
        line for line in section[: end if end > 0 else None].splitlines() if line.startswith("| `")
    ]
    return {n for row in rows for n in re.findall(r"`(metactl_[a-z_]*[a-z])`", row.split(" | ")[0])}


def without_histogram_suffix(name: str) -> str:
    return next((name.removesuffix(s) for s in HISTOGRAM_SUFFIXES if name.endswith(s)), name)


async def test_readme_metrics_table_lists_every_metric_the_dashboard_queries(
    tmp_path: Path,
) -> None:
    table = readme_metrics_table()
    queried = {without_histogram_suffix(n) for n in metric_names("\n".join(dashboard_exprs()))}
    assert queried - BROKER_METRICS <= table, (
        f"the dashboard queries metrics README.md's Metrics table lacks: "
        f"{sorted(queried - BROKER_METRICS - table)}"
    )
    # And the table lists only what a controller exports.
    exported = await exported_names(tmp_path)
    unknown = {n for n in table if n not in exported and n + "_bucket" not in exported}
    assert not unknown, f"README.md's Metrics table names metrics not exported: {sorted(unknown)}"


def test_alert_rules_have_the_required_alerts() -> None:
    doc = yaml.safe_load((GRAFANA / "alerts.yml").read_text())
    rules = {r["alert"]: r for g in doc["groups"] for r in g["rules"]}
    assert set(rules) == {
        "MetactlPotentialDataLoss",
        "MetactlUncleanRecoveryPending",
        "MetactlOfflinePartitions",
        "MetactlUnderMinIsr",
        "MetactlPartitionsOnElr",
        "MetactlBrokersFenced",
        "MetactlControllerDown",
        "MetactlMetadataLagHigh",
        "MetactlMetadataLogWriteFailing",
        "MetactlNoActiveController",
        "MetactlControllerStalled",
        "MetactlReassignmentStuck",
    }
    loss = rules["MetactlPotentialDataLoss"]
    assert loss["expr"] == "increase(metactl_potential_data_loss_events_total[5m]) > 0"
    assert loss["for"] == "0m" and loss["labels"]["severity"] == "critical"
    assert "{{ $labels.topic }}" in loss["annotations"]["summary"]
    assert "{{ $labels.strategy }}" in loss["annotations"]["summary"]
    assert rules["MetactlControllerDown"]["expr"] == 'up{job="metactl-controller"} == 0'
    writes = rules["MetactlMetadataLogWriteFailing"]
    assert writes["expr"] == "increase(metactl_log_append_failures_total[1m]) > 0"
    assert writes["labels"]["severity"] == "critical"
    # Stalled: p99 queue or processing time over 5m, or the age of the event running now
    # (which grows while the loop is stuck, when the histograms see nothing).
    stalled = rules["MetactlControllerStalled"]
    expr = " ".join(stalled["expr"].split())
    for part in (
        "histogram_quantile(0.99, sum by (job, instance, le) "
        "(rate(metactl_event_queue_time_seconds_bucket[5m]))) > 1",
        "histogram_quantile(0.99, sum by (job, instance, le) "
        "(rate(metactl_event_processing_time_seconds_bucket[5m]))) > 1",
        "max by (job, instance) (metactl_event_processing_age_seconds) > 1",
    ):
        assert part in expr, part
    assert stalled["for"] == "2m" and stalled["labels"]["severity"] == "critical"
    stuck = rules["MetactlReassignmentStuck"]
    assert stuck["expr"] == (
        "max by (job, instance) (metactl_oldest_reassignment_age_seconds) > 1800"
    )
    assert stuck["labels"]["severity"] == "warning"
    for name, rule in rules.items():
        assert re.fullmatch(r"(?:[A-Z][a-z]+)+", name), name
        assert rule["labels"]["severity"] in {"critical", "warning"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    # Every alert is tested, firing and not firing.
    tests = yaml.safe_load((GRAFANA / "alerts_test.yml").read_text())["tests"]
    cases = [c for t in tests for c in t["alert_rule_test"]]
    for name in rules:
        mine = [c for c in cases if c["alertname"] == name]
        assert any(c["exp_alerts"] for c in mine), f"{name} is never shown firing"
        assert any(not c["exp_alerts"] for c in mine), f"{name} is never shown quiet"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], capture_output=True, text=True, timeout=60, cwd=GRAFANA, check=False
    )


@needs_promtool
def test_promtool_check_rules() -> None:
    r = promtool("check", "rules", "alerts.yml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 12 rules found" in r.stdout


@needs_promtool
def test_promtool_test_rules() -> None:
    r = promtool("test", "rules", "alerts_test.yml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


@needs_promtool
def test_prometheus_config_template_renders_to_a_valid_config(tmp_path: Path) -> None:
    config = tmp_path / "prometheus.yml"
    config.write_text(
        render_prometheus_config(
            "127.0.0.1:9100",
            brokers=["127.0.0.1:9201", "127.0.0.1:9202"],
            scrape_interval="15s",
            evaluation_interval="15s",
        )
    )
    r = promtool("check", "config", str(config))
    assert r.returncode == 0, r.stdout + r.stderr
    doc = yaml.safe_load(config.read_text())
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    assert jobs["metactl-controller"]["static_configs"][0]["targets"] == ["127.0.0.1:9100"]
    assert jobs["metactl-brokers"]["static_configs"][0]["targets"] == [
        "127.0.0.1:9201",
        "127.0.0.1:9202",
    ]
    # With no brokers the config is still valid.
    config.write_text(render_prometheus_config("127.0.0.1:9100"))
    assert promtool("check", "config", str(config)).returncode == 0
