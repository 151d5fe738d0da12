"""What is chosen in the app (theme, sort, history window) saved to the config file.

The next start reads them back like any other setting (verl_top/settings.py). Writes run in a
worker thread (the UI never waits on the disk), touch only those keys' lines and are atomic; a
file that cannot be edited that way is left alone and the app says so once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verl_top.settings import SettingsError, save_ui_settings


class UiSettingsSaver:
    """Saves the app's choices to ``path`` (None: never saves, as in tests and screenshots)."""

    def __init__(self, app: Any, path: Path | None) -> None:
        self.app = app
        self.path = path
        self.theme: str | None = None  # the theme at start: its own change signal is no choice
        self._failed = False

    def start(self, theme: str) -> None:
        """Remember the theme the app starts with."""
        self.theme = theme

    def theme_changed(self, name: str) -> None:
        """A theme was picked (command palette): saved when its name works at the next start."""
        from verl_top.ui.themes import ThemeError, check_theme_arg

        if name == self.theme:
            return
        self.theme = name
        try:
            check_theme_arg(name)
        except ThemeError:
            return  # registered from a theme file given by path: the name alone would not load
        self.save(theme=name)

    def save(self, **values: Any) -> None:
        """Write ``values`` (settings.UI_KEYS) in a worker thread."""
        if self.path is None:
            return
        path = self.path
        self.app.run_worker(
            lambda: self._write(path, values), thread=True, group="ui-settings", exit_on_error=False
        )

    def _write(self, path: Path, values: dict[str, Any]) -> None:
        try:
            save_ui_settings(path, values)
        except SettingsError as exc:
            if not self._failed:  # once: the choice still applies to this session
                self._failed = True
                self.app.call_from_thread(
                    self.app.notify, str(exc), severity="warning", timeout=10, markup=False
                )
