"""Shared by the episode tests: which sandbox providers an end-to-end episode runs on."""

from __future__ import annotations

import subprocess

import pytest

BASE_IMAGE = "opencode-tui/base:bookworm"


def require_docker_image(image: str = BASE_IMAGE) -> None:
    """Skip (with what to do) when the Docker engine or the local base image is not there."""
    r = subprocess.run(["docker", "image", "inspect", image], capture_output=True)
    if r.returncode != 0:
        pytest.skip("docker or the base image is unavailable (scripts/start-dockerd, scripts/build-images)")


@pytest.fixture(
    params=[pytest.param("docker", marks=pytest.mark.docker), pytest.param("local", marks=pytest.mark.bwrap)]
)
def episode_provider(request) -> str:
    """``docker`` and ``local`` in turn: the providers an episode test runs on."""
    if request.param == "docker":
        require_docker_image()
    return request.param


@pytest.fixture
def docker_base_image() -> str:
    """The local base image (skips when the engine or the image is missing)."""
    require_docker_image()
    return BASE_IMAGE
