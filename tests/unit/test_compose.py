"""docker-compose.yml parses and wires the services: commands, health checks, one GPU per ASR worker."""

from __future__ import annotations

from pathlib import Path

import yaml

from workers.pairs import pair_queue

ROOT = Path(__file__).resolve().parents[2]


def _services() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]


def test_every_role_is_present_with_its_command() -> None:
    services = _services()
    assert {"redis", "postgres", "minio", "minio-init", "api", "ingest-worker", "flower", "s3-listener"} <= set(
        services
    )
    commands = {
        name: " ".join(s.get("command") or []) for name, s in services.items() if isinstance(s.get("command"), list)
    }
    assert commands["api"].startswith("specscribe api")
    assert commands["ingest-worker"].startswith("specscribe worker ingest")
    assert commands["flower"].startswith("specscribe flower")
    assert commands["s3-listener"] == "specscribe s3-listen"
    assert "mc event add" in services["minio-init"]["command"][0]
    assert services["minio"]["environment"]["MINIO_NOTIFY_WEBHOOK_ENDPOINT_SPECSCRIBE"].endswith("/v1/hooks/s3")


def test_long_running_services_have_health_checks() -> None:
    services = _services()
    for name, service in services.items():
        if name not in ("minio-init", "migrate"):
            assert service.get("healthcheck", {}).get("test"), name
    for name in ("api", "ingest-worker", "flower"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_one_asr_worker_per_gpu() -> None:
    asr = {name: s for name, s in _services().items() if name.startswith("asr-")}
    assert len(asr) >= 2
    gpus = []
    for name, service in asr.items():
        assert service["command"][:3] == ["specscribe", "worker", "asr"] and "--pair" in service["command"], name
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert len(devices) == 1 and devices[0]["capabilities"] == ["gpu"] and len(devices[0]["device_ids"]) == 1
        gpus += devices[0]["device_ids"]
        assert service["environment"]["CUDA_VISIBLE_DEVICES"] == "0"
        # the pair jobs default to (so API jobs reach these queues), with a drafter that runs on CUDA
        pair = service["command"][service["command"].index("--pair") + 1]
        assert pair == _env_example()["SPECSCRIBE_DEFAULT_PAIR"] and not pair.endswith("+int8:"), name
        assert f"-d {pair_queue(pair)}.cuda:0@" in service["healthcheck"]["test"][1], name
    assert len(set(gpus)) == len(gpus)


def _env_example() -> dict[str, str]:
    lines = (ROOT / ".env.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def test_env_example_names_real_settings() -> None:
    from workers.settings import Settings

    names = [
        line.split("=", 1)[0]
        for line in (ROOT / ".env.example").read_text().splitlines()
        if line.startswith("SPECSCRIBE_")
    ]
    assert names and all(n.removeprefix("SPECSCRIBE_").lower() in Settings.model_fields for n in names)
