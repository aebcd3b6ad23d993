"""Shared fixtures: the `rein` binary and the plugin directories `cargo xtask test` built."""

import os
from pathlib import Path

import pytest


def _env_path(name: str) -> Path:
    value = os.environ.get(name)
    if not value:
        pytest.exit(f"{name} is unset: run these tests through `cargo xtask test`", returncode=2)
    return Path(value)


@pytest.fixture(scope="session")
def rein_bin() -> Path:
    return _env_path("REIN_BIN")


@pytest.fixture(scope="session")
def plugin_dir() -> Path:
    return _env_path("REIN_PLUGIN_DIR")


@pytest.fixture(scope="session")
def hostile() -> str:
    """The adversarial reward plugin: attacks the host when a group's metadata says
    {"attack": …}, otherwise scores 1 for a completion equal to the reference."""
    return str(_env_path("REIN_TEST_PLUGIN_DIR") / "hostile-reward.wasm")
