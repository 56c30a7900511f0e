"""Fixtures for integration tests: real services and real model weights."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.asr.ct2_import import BundledModelMissing, bundled_model_dir
from workers.settings import get_settings


@pytest.fixture(scope="session")
def bundled_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A temporary SPECSCRIBE_CACHE_DIR for the whole session: bundled models are converted there once."""
    cache = tmp_path_factory.mktemp("specscribe-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECSCRIBE_CACHE_DIR", str(cache))
        get_settings.cache_clear()
        yield cache
    get_settings.cache_clear()


@pytest.fixture(scope="session")
def base_model_dir(bundled_cache_dir: Path) -> Path:
    """Whisper base converted from the bundled CTranslate2 weights (skips without ``specscribe[bundled]``)."""
    try:
        return bundled_model_dir("whisper-base")
    except BundledModelMissing as exc:
        pytest.skip(str(exc))
