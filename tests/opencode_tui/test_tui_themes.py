"""Themes are data: TOML files loaded into Textual themes, selectable by name, overridable by users."""

from __future__ import annotations

import argparse

import pytest
from textual.theme import Theme

from opencode_tui import commands
from opencode_tui.app import OpenCodeTUI
from opencode_tui.themes import (
    APP_VARIABLES,
    BUILTIN_DIR,
    BUILTIN_ORDER,
    ENV_THEME_DIR,
    ThemeError,
    load_theme_file,
    load_themes,
    next_theme,
)


def test_builtin_themes_ship_inside_the_package():
    assert BUILTIN_DIR.parent.name == "opencode_tui"
    themes = load_themes()
    assert list(themes)[:3] == list(BUILTIN_ORDER)
    for name in BUILTIN_ORDER:
        theme = themes[name]
        assert isinstance(theme, Theme) and theme.name == name
        assert set(APP_VARIABLES) <= set(theme.variables), name
    assert not themes["opencode-light"].dark and themes["opencode-dark"].dark


def test_user_theme_dir_adds_and_overrides(tmp_path, monkeypatch):
    (tmp_path / "mine.toml").write_text('name = "mine"\nprimary = "#123456"\n')
    (tmp_path / "dark.toml").write_text('name = "opencode-dark"\nprimary = "#ff0000"\n')
    monkeypatch.setenv(ENV_THEME_DIR, str(tmp_path))
    themes = load_themes()
    assert themes["mine"].primary == "#123456"
    assert themes["opencode-dark"].primary == "#ff0000"
    assert list(themes)[-1] == "mine"


def test_bad_theme_file_names_the_file_and_the_problem(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nprimary = "#000000"\nprimry = "#111111"\n')
    with pytest.raises(ThemeError, match=r"bad\.toml: unknown theme keys \['primry'\]"):
        load_theme_file(bad)
    broken = tmp_path / "broken.toml"
    broken.write_text("name = ")
    with pytest.raises(ThemeError, match=r"broken\.toml: cannot read theme"):
        load_theme_file(broken)


def test_next_theme_cycles():
    names = list(BUILTIN_ORDER)
    assert next_theme(names, "opencode-dark") == "opencode-light"
    assert next_theme(names, "opencode-high-contrast") == "opencode-dark"
    assert next_theme(names, "textual-dark") == "opencode-dark"


def test_app_selects_theme_by_name_and_refuses_unknown(fixture_runs):
    app = OpenCodeTUI(run_dir=fixture_runs / "oom", theme="opencode-light")
    assert app.theme == "opencode-light"
    with pytest.raises(ValueError, match="unknown theme 'nope'"):
        OpenCodeTUI(run_dir=fixture_runs / "oom", theme="nope")


async def test_app_css_variables_exist_for_textual_builtin_themes_too(fixture_runs, replay_loaded):
    app = OpenCodeTUI(run_dir=fixture_runs / "oom")
    async with app.run_test(size=(120, 40)) as pilot:
        await replay_loaded(pilot)
        app.theme = "textual-light"  # not an opencode theme: the app's variables fall back to Textual's
        await pilot.pause()
        for name in APP_VARIABLES:
            assert app.theme_variables[name]


def test_open_refuses_unknown_theme_from_env(fixture_runs, monkeypatch, capsys):
    monkeypatch.setenv(commands.THEME_ENV, "no-such-theme")
    code = commands.cmd_open(argparse.Namespace(run_dir=str(fixture_runs / "oom")))
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown theme 'no-such-theme'" in err
