"""The Prometheus configuration `cluster up` writes for its cluster (issue 22, item 11).

``DATA_DIR/prometheus.yml`` scrapes the controller(s) under the job name
`metactl-controller` (the alert rules and the dashboard's `job` variable expect it) and
every broker under `metactl-brokers`, so the dashboard's broker panels fill; over mutual
TLS as `viewer` unless the cluster runs with ``--insecure`` (grafana/README.md), and
with the repository's alert rules (grafana/alerts.yml) when they are there. Run it with
``prometheus --config.file=DATA_DIR/prometheus.yml``. Decides nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import yaml

from protocol.tls import CA_CERT, VIEWER, cert_path, key_path

__all__ = ["PROMETHEUS_FILE", "prometheus_config", "write_prometheus_config"]

PROMETHEUS_FILE: Final = "prometheus.yml"
ALERT_RULES: Final = Path(__file__).resolve().parents[1] / "grafana" / "alerts.yml"
CONTROLLER_JOB: Final = "metactl-controller"
BROKER_JOB: Final = "metactl-brokers"


def prometheus_config(
    controllers: list[str],
    brokers: list[str],
    certs: Path | None,
    *,
    rules: Path | None = ALERT_RULES,
    scrape_interval: str = "5s",
) -> dict[str, Any]:
    """The configuration as a document: one job for the controllers, one for the
    brokers (left out when there is none)."""

    def job(name: str, targets: list[str]) -> dict[str, Any]:
        out: dict[str, Any] = {"job_name": name, "metrics_path": "/metrics"}
        if certs is not None:
            out["scheme"] = "https"
            out["tls_config"] = {
                "ca_file": str(certs / CA_CERT),
                "cert_file": str(cert_path(certs, VIEWER)),
                "key_file": str(key_path(certs, VIEWER)),
            }
        out["static_configs"] = [{"targets": targets}]
        return out

    doc: dict[str, Any] = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval}
    }
    if rules is not None and rules.exists():
        doc["rule_files"] = [str(rules)]
    jobs = [job(CONTROLLER_JOB, controllers)]
    if brokers:
        jobs.append(job(BROKER_JOB, brokers))
    doc["scrape_configs"] = jobs
    return doc


def write_prometheus_config(
    data_dir: Path, controllers: list[str], brokers: list[str], certs: Path | None
) -> Path:
    """``DATA_DIR/prometheus.yml`` for these targets (rewritten at every start: the
    ports may change)."""
    path = data_dir / PROMETHEUS_FILE
    text = yaml.safe_dump(prometheus_config(controllers, brokers, certs), sort_keys=False)
    header = (
        "# Written by `metactl cluster up` for this cluster (rewritten at each start).\n"
        f"# prometheus --config.file={path}\n"
    )
    path.write_text(header + text, encoding="utf-8")
    return path
