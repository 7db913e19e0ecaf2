"""Generate the metactl Grafana dashboard (grafana/metactl-dashboard.json) from Python.

Built with grafana-foundation-sdk for the Grafana 11.6 line; the JSON is checked in and a
test regenerates it and compares bytes, so edit this file, never the JSON:

    .venv/bin/python grafana/dashboard.py          # rewrite metactl-dashboard.json
    .venv/bin/python grafana/dashboard.py --check  # exit 1 if the checked-in JSON is stale

Owns the dashboard's layout and queries only. The metric names it queries are defined by
controller/runtime/metrics.py and metrics_server.py (controller) and the broker processes
(metadata lag); a test checks that every `metactl_*` name here is one of those. Must not
need a running Grafana.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Final

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash_b
from grafana_foundation_sdk.builders import prometheus as prom_b
from grafana_foundation_sdk.builders import stat as stat_b
from grafana_foundation_sdk.builders import timeseries as ts_b
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dash_m

OUT: Final = Path(__file__).resolve().parent / "metactl-dashboard.json"
UID: Final = "metactl-controller"
DS: Final = dash_m.DataSourceRef(type_val="prometheus", uid="${datasource}")
CTL: Final = '{job=~"$job"}'  # the controller series of the selected job(s)

# The annotation that marks every potential data-loss event on every panel.
DATA_LOSS_ANNOTATION: Final = (
    f"sum by (topic, strategy) (increase(metactl_potential_data_loss_events_total{CTL}[2m])) > 0"
)


def query(
    expr: str, legend: str = "", ref: str = "A", *, instant: bool = False
) -> prom_b.Dataquery:
    q = prom_b.Dataquery().expr(expr).ref_id(ref).datasource(DS)
    if legend:
        q = q.legend_format(legend)
    return q.instant() if instant else q.range()


def thresholds(*steps: tuple[float | None, str]) -> dash_b.ThresholdsConfig:
    return (
        dash_b.ThresholdsConfig()
        .mode(dash_m.ThresholdsMode.ABSOLUTE)
        .steps([dash_m.Threshold(value=v, color=c) for v, c in steps])
    )


def stat(
    panel_id: int,
    title: str,
    expr: str,
    *,
    description: str,
    from_one: str,
    at_zero: str = "green",
) -> stat_b.Panel:
    """A single number, coloured `at_zero` at 0 and `from_one` from 1 up."""
    return (
        stat_b.Panel()
        .id(panel_id)
        .title(title)
        .description(description)
        .datasource(DS)
        .with_target(query(expr, instant=True))
        .unit("none")
        .decimals(0)
        .no_value("0")
        .color_mode(common.BigValueColorMode.BACKGROUND)
        .graph_mode(common.BigValueGraphMode.NONE)
        .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .thresholds(thresholds((None, at_zero), (1, from_one)))
        .height(4)
        .span(4)
    )


def series(
    panel_id: int,
    title: str,
    description: str,
    targets: list[prom_b.Dataquery],
    *,
    unit: str = "none",
    bars: bool = False,
) -> ts_b.Panel:
    p = (
        ts_b.Panel()
        .id(panel_id)
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .line_width(1)
        .fill_opacity(10)
        .show_points(common.VisibilityMode.NEVER)
        .legend(
            common_b.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(
            common_b.VizTooltipOptions()
            .mode(common.TooltipDisplayMode.MULTI)
            .sort(common.SortOrder.DESCENDING)
        )
        .height(8)
        .span(12)
    )
    if bars:
        p = p.draw_style(common.GraphDrawStyle.BARS).fill_opacity(60)
    for t in targets:
        p = p.with_target(t)
    return p


def quantiles(metric: str, job: str = CTL) -> list[prom_b.Dataquery]:
    out = []
    for ref, q in (("A", "0.5"), ("B", "0.99")):
        expr = (
            f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{job}[$__rate_interval])))"
        )
        out.append(query(expr, f"p{q[2:].ljust(2, '0')}", ref))
    return out


def p99_by_event(metric: str) -> prom_b.Dataquery:
    """The 99th percentile of an event histogram, one line per event type."""
    return query(
        "histogram_quantile(0.99, sum by (event, le) "
        f"(rate({metric}_bucket{CTL}[$__rate_interval])))",
        "{{event}}",
    )


def build() -> dash_m.Dashboard:
    d = (
        dash_b.Dashboard("metactl controller")
        .uid(UID)
        .description(
            "KIP-966 controller: brokers, partition health (ELR, LastKnownELR), unclean "
            "recoveries and every potential data-loss event, commit and event latency, "
            "log progress, the metadata lifecycle (reassignments, deletes, ELR clears) "
            "and broker metadata lag. Generated by grafana/dashboard.py."
        )
        .tags(["metactl", "kafka", "kip-966"])
        .editable()
        .tooltip(dash_m.DashboardCursorSync.CROSSHAIR)
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("browser")
        .with_variable(
            dash_b.DatasourceVariable("datasource").label("Data source").type("prometheus")
        )
        .with_variable(
            dash_b.QueryVariable("job")
            .label("Controller job")
            .datasource(DS)
            .query("label_values(metactl_build_info, job)")
            .refresh(dash_m.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dash_m.VariableSort.ALPHABETICAL_ASC)
            .include_all(True)
            .all_value(".*")
            .multi(True)
        )
        .annotation(
            dash_b.AnnotationQuery()
            .name("Annotations & Alerts")
            .datasource(dash_m.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
            .enable(True)
            .hide(True)
            .icon_color("rgba(0, 211, 255, 1)")
            .type("dashboard")
            .built_in(1)
        )
        .annotation(
            dash_b.AnnotationQuery()
            .name("Potential data loss")
            .datasource(DS)
            .enable(True)
            .hide(False)
            .icon_color("red")
            .expr(DATA_LOSS_ANNOTATION)
        )
    )
    d = d.with_row(dash_b.Row("Now").id(100))
    for panel in (
        stat(
            1,
            "Active brokers",
            'sum(metactl_brokers{job=~"$job", state="active"})',
            description="Registered, unfenced and not in controlled shutdown.",
            from_one="green",
            at_zero="red",
        ),
        stat(
            2,
            "Fenced brokers",
            'sum(metactl_brokers{job=~"$job", state="fenced"})',
            description="Registered brokers that are fenced (session expired, or not caught up).",
            from_one="orange",
        ),
        stat(
            3,
            "Offline partitions",
            f"sum(metactl_offline_partitions{CTL})",
            description="Partitions with no leader: unavailable for reads and writes.",
            from_one="red",
        ),
        stat(
            4,
            "Under MinISR",
            f"sum(metactl_under_min_isr_partitions{CTL})",
            description="Partitions whose ISR is below min.insync.replicas (acks=all writes fail).",
            from_one="orange",
        ),
        stat(
            5,
            "Pending unclean recoveries",
            f"sum(metactl_unclean_recoveries_pending{CTL})",
            description="Leaderless partitions waiting for log inspections (GetReplicaLogInfo) "
            "before unclean recovery can choose a leader.",
            from_one="orange",
        ),
        stat(
            6,
            "Potential data-loss events",
            f"sum(increase(metactl_potential_data_loss_events_total{CTL}[$__range]))",
            description="Unclean recoveries (manual elections included) in the selected time "
            "range. Each may have lost acknowledged writes; the red annotations mark them.",
            from_one="red",
        ),
    ):
        d = d.with_panel(panel)
    d = d.with_row(dash_b.Row("Elections and partition health").id(101))
    d = d.with_panel(
        series(
            7,
            "Elections by kind",
            "Leader elections committed per interval: isr, elr (a clean ELR member), "
            "unclean_recovery, preferred, manual; and, of the preferred ones, those of the "
            "automatic leader balance (auto.leader.rebalance.enable).",
            [
                query(
                    f"sum by (kind) (increase(metactl_elections_total{CTL}[$__rate_interval]))",
                    "{{kind}}",
                ),
                query(
                    f"sum(increase(metactl_leader_balance_elections_total{CTL}[$__rate_interval]))",
                    "preferred: automatic leader balance",
                    "B",
                ),
            ],
            bars=True,
        )
    )
    d = d.with_panel(
        series(
            8,
            "Partitions on ELR and LastKnownELR",
            "ELR: partitions running on their last complete copies (ISR below MinISR). "
            "LastKnownELR: ELR members that came back uncleanly. Recovering: leaders chosen "
            "by unclean recovery that have not caught up.",
            [
                query(f"sum(metactl_partitions_with_elr{CTL})", "ELR", "A"),
                query(f"sum(metactl_partitions_with_last_known_elr{CTL})", "LastKnownELR", "B"),
                query(f"sum(metactl_recovering_partitions{CTL})", "recovering", "C"),
                query(f"sum(metactl_offline_partitions{CTL})", "offline", "D"),
            ],
        )
    )
    d = d.with_panel(
        series(
            9,
            "Potential data-loss events by topic",
            "Unclean recoveries committed per interval, by topic and recovery strategy.",
            [
                query(
                    "sum by (topic, strategy) (increase("
                    f"metactl_potential_data_loss_events_total{CTL}[$__rate_interval])) > 0",
                    "{{topic}} ({{strategy}})",
                )
            ],
            bars=True,
        )
    )
    d = d.with_panel(
        series(
            10,
            "Brokers by state",
            "Registered brokers: active, fenced, in controlled shutdown.",
            [query(f"sum by (state) (metactl_brokers{CTL})", "{{state}}")],
        )
    )
    d = d.with_row(dash_b.Row("Controller latency and log").id(102))
    d = d.with_panel(
        series(
            11,
            "Commit latency",
            "Durable store append (one group commit): median and 99th percentile.",
            quantiles("metactl_commit_latency_seconds"),
            unit="s",
        )
    )
    d = d.with_panel(
        series(
            12,
            "Event queue time",
            "Time events wait in the controller queue (p50, p99), and the 99th percentile of "
            "their processing time.",
            [
                *quantiles("metactl_event_queue_time_seconds"),
                query(
                    "histogram_quantile(0.99, sum by (le) (rate("
                    f"metactl_event_processing_time_seconds_bucket{CTL}[$__rate_interval])))",
                    "processing p99",
                    "C",
                ),
            ],
            unit="s",
        )
    )
    d = d.with_panel(
        series(
            13,
            "Log end offset",
            "Offset of the next record, and of the newest durably committed record.",
            [
                query(f"max(metactl_log_end_offset{CTL})", "log end offset", "A"),
                query(f"max(metactl_last_committed_offset{CTL})", "last committed", "B"),
            ],
        )
    )
    d = d.with_panel(
        series(
            14,
            "Records committed",
            "Metadata records committed per second, by record type.",
            [
                query(
                    "sum by (type) "
                    f"(rate(metactl_committed_records_total{CTL}[$__rate_interval])) > 0",
                    "{{type}}",
                )
            ],
            unit="ops",
        )
    )
    d = d.with_row(dash_b.Row("Event loop").id(105))
    d = d.with_panel(
        series(
            19,
            "Event queue time p99 by event",
            "How long each type of event waited in the controller queue (99th percentile): "
            "all types rise together when the loop is saturated or was stalled by one slow "
            "event. The controller should answer within about 250 ms.",
            [p99_by_event("metactl_event_queue_time_seconds")],
            unit="s",
        )
    )
    d = d.with_panel(
        series(
            20,
            "Event processing time p99 by event",
            "Time to decide and replay one event of each type (99th percentile, commit "
            "excluded): the type that rises is the one that stalls the loop.",
            [p99_by_event("metactl_event_processing_time_seconds")],
            unit="s",
        )
    )
    d = d.with_panel(
        series(
            21,
            "Events by type",
            "Events handled per second, by type (requests, Tick, and the continuations of "
            "work larger than one event).",
            [
                query(
                    f"sum by (event) (rate(metactl_events_total{CTL}[$__rate_interval])) > 0",
                    "{{event}}",
                )
            ],
            unit="ops",
        )
    )
    d = d.with_panel(
        series(
            22,
            "Event in progress",
            "How long the controller has been on the event it is handling now, read at "
            "scrape time (metactl_event_processing_age_seconds; 0 between events). It grows "
            "during a stall, before the histograms can show it.",
            [
                query(
                    f"max by (instance) (metactl_event_processing_age_seconds{CTL})",
                    "{{instance}}",
                )
            ],
            unit="s",
        )
    )
    d = d.with_row(dash_b.Row("Metadata lifecycle").id(106))
    d = d.with_panel(
        series(
            23,
            "Reassignments in progress",
            "Partitions with a reassignment in progress (KIP-455: new replicas copying, "
            "the old ones still assigned until every new one is in the ISR).",
            [query(f"sum(metactl_partitions_reassigning{CTL})", "partitions reassigning")],
        )
    )
    d = d.with_panel(
        series(
            26,
            "Oldest reassignment in progress",
            "How long the oldest reassignment still in progress has been moving "
            "(metactl_oldest_reassignment_age_seconds; 0: none). MetactlReassignmentStuck "
            "fires when it passes 30 minutes.",
            [
                query(
                    f"max by (instance) (metactl_oldest_reassignment_age_seconds{CTL})",
                    "{{instance}}",
                )
            ],
            unit="s",
        )
    )
    d = d.with_panel(
        series(
            24,
            "Lifecycle operations",
            "Per interval: reassignments started, completed and cancelled, topics "
            "deleted, brokers unregistered, and ELR clears by scope (a topic's or the "
            "cluster default's min.insync.replicas, or an ELR feature downgrade).",
            [
                query(
                    "sum by (outcome) "
                    f"(increase(metactl_reassignments_total{CTL}[$__rate_interval])) > 0",
                    "reassignments {{outcome}}",
                    "A",
                ),
                query(
                    f"sum(increase(metactl_topics_deleted_total{CTL}[$__rate_interval])) > 0",
                    "topics deleted",
                    "B",
                ),
                query(
                    f"sum(increase(metactl_brokers_unregistered_total{CTL}[$__rate_interval])) > 0",
                    "brokers unregistered",
                    "C",
                ),
                query(
                    "sum by (scope) "
                    f"(increase(metactl_elr_clears_total{CTL}[$__rate_interval])) > 0",
                    "ELR cleared ({{scope}})",
                    "D",
                ),
            ],
            bars=True,
        )
    )
    d = d.with_panel(
        series(
            25,
            "ELR feature level",
            "Effective eligible.leader.replicas.version (kafka-features): 1 while KIP-966 "
            "tracks Eligible Leader Replicas, 0 in classic mode (a downgrade clears every "
            "ELR and LastKnownELR).",
            [
                query(
                    "max by (instance) (metactl_feature_level"
                    '{job=~"$job", feature="eligible.leader.replicas.version"})',
                    "{{instance}}",
                )
            ],
        )
    )
    d = d.with_row(dash_b.Row("Brokers").id(103))
    d = d.with_panel(
        series(
            15,
            "Broker metadata lag (records)",
            "Committed metadata records a broker has not applied yet "
            "(metactl_broker_metadata_lag_records, exposed by each broker).",
            [query("max by (instance) (metactl_broker_metadata_lag_records)", "{{instance}}")],
        )
    )
    d = d.with_panel(
        series(
            16,
            "Broker metadata lag (seconds)",
            "How far behind the committed log a broker's applied metadata is "
            "(metactl_broker_metadata_lag_seconds, exposed by each broker).",
            [query("max by (instance) (metactl_broker_metadata_lag_seconds)", "{{instance}}")],
            unit="s",
        )
    )
    d = d.with_row(dash_b.Row("Controller quorum").id(104))
    d = d.with_panel(
        series(
            17,
            "Active controller",
            "1 for the controller that writes the metadata log, 0 for hot standbys "
            "(metactl_controller_active; HA controllers on etcd, docs/ha.md).",
            [query(f"max by (instance) (metactl_controller_active{CTL})", "{{instance}}")],
        )
    )
    d = d.with_panel(
        series(
            18,
            "Controller failovers",
            "Times a controller took over as the active one "
            "(increase of metactl_controller_failovers_total), and times a standby "
            "ended the term of an active controller it found dead, its port refusing "
            "connections (metactl_controller_dead_active_revocations_total; docs/ha.md, "
            '"A killed active controller"): a failover without one waited out the TTL.',
            [
                query(
                    "sum by (instance) "
                    f"(increase(metactl_controller_failovers_total{CTL}[$__rate_interval]))",
                    "{{instance}}",
                ),
                query(
                    "sum by (instance) (increase("
                    f"metactl_controller_dead_active_revocations_total{CTL}[$__rate_interval]))",
                    "{{instance}} ended a dead active's term",
                    "B",
                ),
            ],
            bars=True,
        )
    )
    return d.build()


def render() -> str:
    """The dashboard as the checked-in JSON text (deterministic)."""
    doc: dict[str, Any] = json.loads(json.dumps(build(), cls=JSONEncoder))
    # The SDK's AnnotationQuery has no fields for the Prometheus annotation's title, text
    # and tags; without them Grafana shows an empty marker. Add them here.
    for a in doc["annotations"]["list"]:
        if a.get("expr") == DATA_LOSS_ANNOTATION:
            a.update(
                {
                    "step": "60s",
                    "titleFormat": "Potential data loss: {{topic}}",
                    "textFormat": "Unclean recovery on topic {{topic}} (strategy {{strategy}}): "
                    "the elected replica may lack acknowledged writes.",
                    "tagKeys": "topic,strategy",
                    "useValueForTime": False,
                }
            )
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the JSON file is stale")
    p.add_argument("--stdout", action="store_true", help="print instead of writing")
    args = p.parse_args(argv)
    text = render()
    if args.stdout:
        sys.stdout.write(text)
    elif args.check:
        if not OUT.exists() or OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT} is stale: run python grafana/dashboard.py", file=sys.stderr)
            return 1
    else:
        OUT.write_text(text, encoding="utf-8")
        print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
