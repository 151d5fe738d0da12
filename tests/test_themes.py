"""Themes: the shipped TOML files, validation before registration, user folders, --theme."""

from __future__ import annotations

import colorsys
from pathlib import Path

import pytest
from textual.color import Color

from verl_top.cli import main
from verl_top.ui.app import VerlTopApp
from verl_top.ui.themes import (
    DEFAULT_THEME,
    ThemeError,
    builtin_theme_dir,
    discover_themes,
    install_themes,
    load_theme_file,
    resolve_theme,
    textual_theme_names,
    user_theme_dirs,
)

REPO_THEMES = Path(__file__).parent.parent / "themes"


@pytest.fixture(autouse=True)
def no_user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI must not read the real ~/.config/verl-top of whoever runs the tests."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


SHIPPED = ("verl-dark", "classic", "light", "high-contrast")


def test_repo_themes_and_package_copies_are_identical() -> None:
    repo = {p.name: p.read_bytes() for p in REPO_THEMES.glob("*.toml")}
    package = {p.name: p.read_bytes() for p in builtin_theme_dir().glob("*.toml")}
    assert repo == package, "themes/ and verl_top/themes/ differ: copy themes/*.toml over"
    assert {f"{name}.toml" for name in SHIPPED} <= set(repo)


def test_every_shipped_theme_is_valid_and_named_after_its_file() -> None:
    found = discover_themes([builtin_theme_dir()])
    assert not found.errors
    assert set(SHIPPED) <= set(found.themes)
    for name, theme in found.themes.items():
        assert (builtin_theme_dir() / f"{name}.toml").exists()
        for key in ("primary", "warning", "error", "success", "background", "foreground"):
            Color.parse(getattr(theme, key))  # every status colour is set and parses
    assert found.themes["light"].dark is False
    assert found.themes[DEFAULT_THEME].dark is True
    assert Color.parse(found.themes["classic"].background) == Color(0, 0, 0)


def _hue(colour: str) -> float:
    c = Color.parse(colour)
    return colorsys.rgb_to_hls(c.r / 255, c.g / 255, c.b / 255)[0] * 360


def test_high_contrast_status_colours_avoid_red_green() -> None:
    theme = load_theme_file(builtin_theme_dir() / "high-contrast.toml")
    # Busy reads blue, idle/down reads orange, low reads yellow: no red/green pair needed.
    assert 180 <= _hue(theme.success) <= 260
    assert 25 <= _hue(theme.error) <= 45
    assert 45 < _hue(theme.warning) <= 65


def test_bad_colour_names_the_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\nprimary = "notacolor"\n')
    with pytest.raises(ThemeError) as err:
        load_theme_file(bad)
    assert str(err.value) == f"{bad}: field 'primary': 'notacolor' is not a colour"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('primary = "#fff"\nprimry = "#000"\n', "unknown field 'primry'"),
        ('name = "x"\n', "field 'primary' is missing"),
        ('primary = "#fff"\ndark = "yes"\n', "field 'dark' must be true or false"),
        ('primary = "#fff"\nerror = 12\n', "field 'error': 12 is not a colour"),
        ('primary = "#fff"\ntext_alpha = 3\n', "field 'text_alpha' must be a number from 0 to 1"),
        ('primary = "#fff"\n[variables]\nx = 1\n', "'variables' must be a table of strings"),
        ("primary = \n", "not valid TOML"),
    ],
)
def test_invalid_theme_files_are_refused(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "t.toml"
    path.write_text(text)
    with pytest.raises(ThemeError, match=str(path)) as err:
        load_theme_file(path)
    assert expected in str(err.value)


def test_name_defaults_to_the_file_stem(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('primary = "rgb(10, 20, 30)"\n[variables]\nfooter-key-foreground = "#ff0000"\n')
    theme = load_theme_file(path)
    assert theme.name == "mine"
    assert theme.variables == {"footer-key-foreground": "#ff0000"}


def test_user_dirs_follow_xdg_then_home() -> None:
    dirs = user_theme_dirs({"XDG_CONFIG_HOME": "/x", "HOME": "/h"})
    assert dirs == [Path("/x/verl-top/themes"), Path("/h/.config/verl-top/themes")]
    assert user_theme_dirs({"HOME": "/h"}) == [Path("/h/.config/verl-top/themes")]


def test_user_theme_overrides_and_bad_file_is_reported(tmp_path: Path) -> None:
    user = tmp_path / "themes"
    user.mkdir()
    (user / "classic.toml").write_text('name = "classic"\nprimary = "#123456"\n')
    (user / "broken.toml").write_text('primary = "nope"\n')
    found = discover_themes([builtin_theme_dir(), user])
    assert found.themes["classic"].primary == "#123456"  # the user's wins
    assert found.errors == [f"{user / 'broken.toml'}: field 'primary': 'nope' is not a colour"]
    assert "broken" not in found.themes


def test_resolve_theme_name_file_and_unknown(tmp_path: Path) -> None:
    themes = discover_themes([builtin_theme_dir()]).themes
    assert resolve_theme(None, themes) == (DEFAULT_THEME, None)
    assert resolve_theme("classic", themes) == ("classic", None)
    assert resolve_theme("nord", themes, textual_theme_names()) == ("nord", None)
    f = tmp_path / "file-theme.toml"
    f.write_text('name = "from-file"\nprimary = "#abcdef"\n')
    name, theme = resolve_theme(str(f), themes)
    assert name == "from-file" and theme is not None
    with pytest.raises(ThemeError, match="unknown theme 'nosuch': choose one of classic"):
        resolve_theme("nosuch", themes, textual_theme_names())


async def test_app_registers_themes_for_the_palette_and_survives_a_bad_one(tmp_path: Path) -> None:
    from test_ui_app import make_app  # noqa: PLC0415 - shared app factory of the UI tests

    user = tmp_path / "themes"
    user.mkdir()
    (user / "bad.toml").write_text('name = "bad"\nprimary = "notacolor"\n')
    app: VerlTopApp = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        errors = install_themes(app, "high-contrast", [builtin_theme_dir(), user])
        await pilot.pause()
        assert app.theme == "high-contrast"
        assert set(SHIPPED) <= set(app.available_themes)
        assert "bad" not in app.available_themes  # never registered: no crash while drawing
        assert errors == [f"{user / 'bad.toml'}: field 'primary': 'notacolor' is not a colour"]
        # The palette's theme picker lists our themes.
        app.search_themes()
        await pilot.pause(0.3)
        from textual.command import CommandPalette
        from textual.widgets import OptionList

        palette = app.screen
        assert isinstance(palette, CommandPalette)
        options = palette.query_one(OptionList)
        prompts = [str(options.get_option_at_index(i).prompt) for i in range(options.option_count)]
        assert any("high-contrast" in p for p in prompts), prompts
        assert any("classic" in p for p in prompts)


def test_cli_refuses_an_unknown_theme(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--demo", "--theme", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("verl-top: --theme: unknown theme 'nosuch'")
    assert "high-contrast" in err


def test_cli_refuses_a_bad_theme_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('primary = "#fff"\nsurface = "fuchsia-ish"\n')
    assert main(["--demo", "--theme", str(bad)]) == 2
    assert f"{bad}: field 'surface': 'fuchsia-ish' is not a colour" in capsys.readouterr().err
